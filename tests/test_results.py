"""Typed stage results: one serializer splits each into `_stats.json` (the data) and `_timings.json` (the run)."""

from dataclasses import dataclass

import pytest

from tokenmill.common.io import STATS_FILE, TIMINGS_FILE, read_json
from tokenmill.common.results import StageResult, flattened, read_result, result_files, run_fact, write_result
from tokenmill.errors import StaleUpstreamError


@dataclass(frozen=True, kw_only=True)
class SampleResult(StageResult):
    dropped_by_language: dict[str, dict[str, int]]  # starts with the dropped_ prefix, yet a field of its own
    pii: dict[str, int] = flattened("pii_")
    note: str | None = None
    workers: int = run_fact()
    rebuild_reason: str | None = run_fact(default=None)


def sample(**changes) -> SampleResult:
    fields = dict(
        docs_in=5,
        docs_out=3,
        dropped={"empty": 1, "too_short": 1},
        seconds=0.25,
        dropped_by_language={"en": {"empty": 1}},
        pii={"email": 2},
        workers=2,
    )
    return SampleResult(**{**fields, **changes})


def test_fields_go_to_their_file_flattened_and_none_left_out(tmp_path):
    result = sample()
    write_result(tmp_path, result)
    assert read_json(tmp_path / STATS_FILE) == {
        "docs_in": 5,
        "docs_out": 3,
        "dropped_empty": 1,
        "dropped_too_short": 1,
        "dropped_by_language": {"en": {"empty": 1}},
        "pii_email": 2,
    }
    assert read_json(tmp_path / TIMINGS_FILE) == {"seconds": 0.25, "workers": 2}
    assert result_files(result) == (read_json(tmp_path / STATS_FILE), read_json(tmp_path / TIMINGS_FILE))
    assert read_result(tmp_path, SampleResult) == result
    assert result.dropped_total == 2


def test_a_rerun_differs_only_in_timings(tmp_path):
    for name, result in (("a", sample()), ("b", sample(seconds=9.0, workers=8))):
        (tmp_path / name).mkdir()
        write_result(tmp_path / name, result)
    assert (tmp_path / "a" / STATS_FILE).read_bytes() == (tmp_path / "b" / STATS_FILE).read_bytes()
    assert (tmp_path / "a" / TIMINGS_FILE).read_bytes() != (tmp_path / "b" / TIMINGS_FILE).read_bytes()


def test_reading_without_timings_or_with_a_missing_field(tmp_path):
    write_result(tmp_path, sample(note="kept", rebuild_reason="first build"))
    (tmp_path / TIMINGS_FILE).unlink()  # how the run went is not needed to use the data
    again = read_result(tmp_path, SampleResult)
    assert (again.note, again.seconds, again.workers, again.rebuild_reason) == ("kept", 0, 0, None)
    stats = read_json(tmp_path / STATS_FILE)
    del stats["dropped_by_language"]
    (tmp_path / STATS_FILE).write_text(str(stats).replace("'", '"'), encoding="utf-8")
    with pytest.raises(StaleUpstreamError, match=r"_stats.json.*dropped_by_language.*rematerialize"):
        read_result(tmp_path, SampleResult)
