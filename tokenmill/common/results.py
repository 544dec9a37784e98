"""What a stage run reports, as a typed result: each stage declares a `StageResult` subclass; `write_result` is the
one function that turns any of them into the stage's `_stats.json` (what the data is: identical across identical
runs) and `_timings.json` (how the run went: seconds, workers, tasks), and `read_result` the one that reads them
back. A field says which file it belongs in (`run_fact`) and whether it is spread over prefixed keys
(`flattened`: `dropped` -> `dropped_<reason>`)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tokenmill.common.io import STATS_FILE, TIMINGS_FILE, atomic_write_json, read_json
from tokenmill.errors import StaleUpstreamError

_RUN_FACT = "run_fact"
_PREFIX = "prefix"


def run_fact(**kwargs: Any) -> Any:
    """A field that describes the run rather than the data (seconds, workers, versions published): `_timings.json`."""
    return field(metadata={_RUN_FACT: True}, **kwargs)


def flattened(prefix: str, **kwargs: Any) -> Any:
    """A {name: count} field written as one `<prefix><name>` key per entry, as the UI and the funnel show them."""
    return field(metadata={_PREFIX: prefix}, **kwargs)


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """Records in and out of a stage run, the records dropped per reason (in = out + dropped), and its wall time.
    A field that is None is not written (an optional figure)."""

    docs_in: int
    docs_out: int
    dropped: dict[str, int] = flattened("dropped_")
    seconds: float = run_fact()

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


R = TypeVar("R", bound=StageResult)


def result_files(result: StageResult) -> tuple[dict, dict]:
    """(`_stats.json`, `_timings.json`) contents of a result."""
    stats: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if value is None:
            continue
        into = timings if f.metadata.get(_RUN_FACT) else stats
        if _PREFIX in f.metadata:
            into.update({f"{f.metadata[_PREFIX]}{name}": n for name, n in value.items()})
        else:
            into[f.name] = value
    return stats, timings


def write_result(out_dir: str | os.PathLike, result: StageResult) -> None:
    """The stage's `_stats.json` and `_timings.json`, each written atomically."""
    stats, timings = result_files(result)
    atomic_write_json(Path(out_dir) / STATS_FILE, stats)
    atomic_write_json(Path(out_dir) / TIMINGS_FILE, timings)


def read_result(out_dir: str | os.PathLike, kind: type[R]) -> R:
    """The result a stage wrote into `out_dir` (`_timings.json` may be gone: its fields then read 0 or empty)."""
    out_dir = Path(out_dir)
    stats = read_json(out_dir / STATS_FILE)
    timings = read_json(out_dir / TIMINGS_FILE) if (out_dir / TIMINGS_FILE).exists() else {}
    fields = dataclasses.fields(kind)
    names = {f.name for f in fields}
    values: dict[str, Any] = {}
    for f in fields:
        source = timings if f.metadata.get(_RUN_FACT) else stats
        if _PREFIX in f.metadata:
            prefix = f.metadata[_PREFIX]
            values[f.name] = {
                k.removeprefix(prefix): v for k, v in source.items() if k.startswith(prefix) and k not in names
            }
        elif f.name in source:
            values[f.name] = source[f.name]
        elif f.metadata.get(_RUN_FACT) and f.default is dataclasses.MISSING:
            values[f.name] = _empty(f.type)
    try:
        return kind(**values)
    except TypeError as e:  # a stats file without a field this code needs: written by an older tokenmill
        raise StaleUpstreamError(f"{out_dir / STATS_FILE}: {e}; rematerialize this stage") from e


def _empty(annotation: Any) -> Any:
    """The value of a run fact `_timings.json` no longer holds (it is not needed to use the data)."""
    text = str(annotation)
    return {} if text.startswith("dict") else [] if text.startswith("list") else 0
