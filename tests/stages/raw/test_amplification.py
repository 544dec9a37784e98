"""Tiny hostile files cost what they are: the quarantine of a file stays within its budget however many of its lines
are rejected (each still counted, explain still answering), and runs of blank lines are read, not parsed."""

import json
import random
import time
from pathlib import Path

import pytest

from tokenmill.common.io import REJECTED_FILE, iter_jsonl, record_shards
from tokenmill.common.quarantine import BUDGET_FLOOR, FULL_PER_REASON
from tokenmill.explain import explain, render
from tokenmill.stages.raw import RawSettings, ingest
from tokenmill.stages.raw import stream as stream_module
from tokenmill.stages.raw.stream import Oversized, open_source, zstd


def _rejected(out: Path) -> list[dict]:
    return list(iter_jsonl(out / REJECTED_FILE))


def test_two_hundred_thousand_empty_objects_write_a_quarantine_within_the_files_budget(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    body = b"{}\n" * 100_000 + b'{"text": "a kept record in the middle"}\n' + b"{}\n" * 100_000
    (src / "objects.jsonl.zst").write_bytes(zstd.compress(body))
    assert (src / "objects.jsonl.zst").stat().st_size < 2_000
    result = ingest(src, tmp_path / "out", RawSettings(), workers=1)
    # every rejection counted, the record between them kept
    assert result.rejected_by_reason == {"no_text_field": 200_000} and result.docs_out == 1
    size = (tmp_path / "out" / REJECTED_FILE).stat().st_size
    assert size < 2 * BUDGET_FLOOR + 10_000  # an entry each: 26 MB
    entries = _rejected(tmp_path / "out")
    assert sum(e.get("count", 1) for e in entries) == 200_000
    runs = [e for e in entries if "count" in e]
    # the kept record at line 100,001 breaks the run: no entry covers it
    assert not any(e["line"] <= 100_001 <= e["last_line"] for e in runs)
    assert runs[-1]["last_line"] == 200_001


def test_explain_answers_for_a_line_past_the_cap_from_its_run(tmp_path):
    data = tmp_path / "data"
    src = tmp_path / "src"
    src.mkdir()
    (src / "objects.jsonl.zst").write_bytes(zstd.compress(b"[1]\n" * 60_000 + b'{"text": "kept"}\n'))
    ingest(src, data / "raw_records" / "b000001", RawSettings(), workers=1)
    fate = explain(data, "objects.jsonl.zst:50000")
    assert fate is not None and fate["reason"] == "not_an_object" and fate["source"]["line"] == 50_000
    assert fate["run"]["count"] > 1 and fate["run"]["line"] <= 50_000 <= fate["run"]["last_line"]
    assert "one of" in render(fate) and "past the file's quarantine budget" in render(fate)
    early = explain(data, "objects.jsonl.zst:3")  # the first rejections keep their own entries
    assert early is not None and "run" not in early and early["reason"] == "not_an_object"
    assert explain(data, "objects.jsonl.zst:60002") is None  # past the end of the file


def test_every_reason_keeps_its_first_entries_in_full_past_the_budget(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lines = [b"{}\n"] * 30_000 + [b"not json\n", b"[5]\n"] * 20
    (src / "mixed.jsonl.zst").write_bytes(zstd.compress(b"".join(lines)))
    result = ingest(src, tmp_path / "out", RawSettings(), workers=1)
    entries = _rejected(tmp_path / "out")
    full = [e for e in entries if "count" not in e]
    for reason in ("malformed_json", "not_an_object"):
        assert result.rejected_by_reason[reason] == 20
        assert sum(e["reason"] == reason for e in full) >= FULL_PER_REASON
        assert sum(e.get("count", 1) for e in entries if e["reason"] == reason) == 20


def test_a_file_with_few_bad_lines_keeps_every_entry_in_full(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    rows = [json.dumps({"text": f"record {i}"}) if i % 10 else "not json" for i in range(5_000)]
    (src / "some_bad.jsonl").write_text("\n".join(rows) + "\n")
    ingest(src, tmp_path / "out", RawSettings(), workers=1)
    entries = _rejected(tmp_path / "out")
    assert len(entries) == 500 and not any("count" in e for e in entries)


def _reference_lines(data: bytes, limit: int) -> list[tuple[int, bytes]]:
    """What content_lines yields, by the definition: every line with a non-whitespace byte, numbered."""
    out = []
    for n, line in enumerate(data.splitlines(keepends=True), 1):
        if line.strip():
            body = line[:-1] if line.endswith(b"\n") else line
            out.append((n, Oversized(line[: min(200, limit + 1)]) if len(body) > limit else line))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_content_lines_match_a_line_split_for_any_block_size(tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    pieces = [b"\n", b"\r\n", b"   \n", b"\t\n", b"x\n", b'{"a": 1}\n', b"y" * 90 + b"\n", b"z" * 300 + b"\n", b" q "]
    data = b"".join(rng.choice(pieces) for _ in range(3_000)) + rng.choice([b"", b"tail", b"\n\n"])
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    monkeypatch.setattr(stream_module, "LINE_BLOCK", rng.choice([1, 7, 64, 1000]))
    with open_source(str(path), None, 1 << 30, 100) as f:
        got = list(f.content_lines())
    want = _reference_lines(data, 100)
    assert [(n, type(x), bytes(x)) for n, x in got] == [(n, type(x), bytes(x)) for n, x in want]


def _raw_cpu_seconds(src: Path, out: Path) -> float:
    start = time.process_time()
    ingest(src, out, RawSettings(), workers=1)
    return time.process_time() - start


@pytest.mark.parametrize("name", ["blank.jsonl.zst", "blank.txt.zst"])
def test_a_run_of_blank_lines_costs_what_reading_it_costs(tmp_path, name):
    src = tmp_path / "src"
    src.mkdir()
    # 32 MiB of newlines (and a few spaces), then one record: the record's line number is exact
    blank = b"\n" * (32 << 20) + b"  \r\n" * 1000
    text = b'{"text": "after the blank lines"}\n' if name.endswith(".jsonl.zst") else b"after the blank lines\n"
    (src / name).write_bytes(zstd.compress(blank + text))
    seconds = _raw_cpu_seconds(src, tmp_path / "out")
    records = [r for shard in record_shards(tmp_path / "out") for r in iter_jsonl(shard)]
    assert [(r["text"], r["source"]["line"]) for r in records] == [("after the blank lines", (32 << 20) + 1001)]
    # read a line at a time, 32 MiB of newlines took tens of CPU-s (docs/profile.md, "Tiny hostile files")
    assert seconds < 5, seconds
