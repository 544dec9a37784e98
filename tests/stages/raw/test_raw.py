"""raw_records: readers, presets, bad input, determinism, and the asset on the demo corpus."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import BATCH, materialize_batch

from assets.raw import raw_records
from tests.conftest import REPO
from tokenmill.common.io import (
    REJECTED_FILE,
    TIMINGS_FILE,
    iter_jsonl,
    json_parser,
    record_id,
    record_shards,
)
from tokenmill.common.results import read_result
from tokenmill.common.samples import SAMPLES_PER_REASON
from tokenmill.errors import SourceError
from tokenmill.stages.raw import RawResult, RawSettings, ingest


def records(folder) -> list[dict]:
    return [r for shard in record_shards(folder) for r in iter_jsonl(shard)]


def rejected(folder) -> list[dict]:
    path = Path(folder) / REJECTED_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def run(source, tmp_path, workers=1, **settings) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
    stats = ingest(Path(source), out, RawSettings(**settings), workers=workers)
    assert read_result(out, type(stats)) == stats
    assert stats.docs_in == stats.docs_out + sum(stats.rejected_by_reason.values())
    return stats, records(out), rejected(out)


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------ the asset, demo corpus


def materialize_raw(source: Path, data: Path, **config):
    run_config = {"ops": {"raw_records": {"config": config}}} if config else None
    return materialize_batch([raw_records], data, source, run_config)


def test_raw_records_on_demo_corpus(demo_source, demo_manifest, tmp_path):
    result = materialize_raw(demo_source, tmp_path / "data")
    assert result.success
    meta = result.asset_materializations_for_node("raw_records")[0].metadata
    out = tmp_path / "data" / "raw_records" / BATCH
    recs = records(out)
    assert meta["docs_out"].value == len(recs) == demo_manifest["records"]
    assert meta["docs_in"].value == demo_manifest["records"] + len(demo_manifest["rejected_raw"])
    assert meta["path"].value == str(out)
    first = recs[0]  # the preview starts with the first record: id and where it came from
    assert f"{first['id']} {first['source']['path']}:{first['source']['line']}" in meta["preview"].value
    rows = {r.data["path"]: r.data for r in meta["files"].value.records}
    for path, want in demo_manifest["files"].items():
        assert (rows[path]["records"], rows[path]["rejected"]) == (want["records"], want["rejected"]), path
    # every planted bad line is rejected, at its line, for its reason, and nothing else is
    got = sorted((r["path"], r["line"], r["reason"]) for r in rejected(out))
    assert got == sorted((r["path"], r["line"], r["reason"]) for r in demo_manifest["rejected_raw"])
    for r in rejected(out):
        assert r["detail"] and "snippet" in r
    # the manifest's ids are the ids raw_records emits
    ids = {r["id"] for r in recs}
    assert len(ids) == len(recs)
    planted = {i for pair in demo_manifest["exact_duplicates"] for i in pair}
    planted |= {p[k] for p in demo_manifest["near_duplicates"] for k in ("a", "b")}
    for key in ("mojibake", "garbled", "header_metadata", "boilerplate_docs", "genuine_frequent_docs"):
        planted |= {p["id"] for p in demo_manifest[key]}
    assert planted <= ids
    stats = read_result(out, RawResult)
    assert stats.skipped_files == demo_manifest["skipped_files"]
    # ids are stable across runs (same input, same ids, same bytes)
    again = materialize_raw(demo_source, tmp_path / "data2")
    assert again.success
    for a, b in zip(record_shards(out), record_shards(tmp_path / "data2" / "raw_records" / BATCH), strict=True):
        assert a.read_bytes() == b.read_bytes()


def test_contracts_hold_on_demo_output(demo_source, shared_dir, tmp_path):
    ingest(demo_source, tmp_path / "raw_records", RawSettings())
    tool = shared_dir / "tools" / "check_contracts.py"
    res = subprocess.run([sys.executable, str(tool), str(tmp_path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "raw_records: " in res.stdout


def test_missing_source_is_a_clear_error_before_any_work(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(SourceError, match="nope.*TOKENMILL_SOURCE"):
        ingest(missing, tmp_path / "out", RawSettings())
    assert not (tmp_path / "out").exists()
    with pytest.raises(Exception) as info:
        materialize_raw(missing, tmp_path / "data")
    assert "does not exist" in str(info.value) or "does not exist" in str(info.value.__cause__)
    assert not (tmp_path / "data" / "raw_records").exists()


def test_empty_source_is_a_source_error(tmp_path):
    write(tmp_path / "src" / "notes.md", "# no corpus file here")
    with pytest.raises(SourceError, match="no .jsonl, .json, .txt or .csv file.*set TOKENMILL_SOURCE"):
        ingest(tmp_path / "src", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_settings_are_checked():
    for bad in (
        {"txt_mode": "paragraphs"},
        {"records_per_shard": 0},
        {"task_mb": 0},
        {"csv_delimiter": ";;"},
        {"csv_delimiter": '"'},
        {"text_field": ""},
    ):
        with pytest.raises(ValueError):
            RawSettings(**bad)


def test_byte_identical_for_any_worker_count_and_shard_rollover(demo_source, tmp_path):
    # small tasks and shards so that several tasks and rollovers happen
    kw = dict(task_mb=0.2, records_per_shard=300)
    s1 = ingest(demo_source, tmp_path / "w1", RawSettings(**kw), workers=1)
    s2 = ingest(demo_source, tmp_path / "w2", RawSettings(**kw), workers=2)
    assert s1.tasks > 2 and s1.shards > s1.tasks and s2.shards == s1.shards
    files1 = sorted(p.name for p in (tmp_path / "w1").iterdir())
    assert files1 == sorted(p.name for p in (tmp_path / "w2").iterdir())
    for name in files1:
        if name != TIMINGS_FILE:
            assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes(), name
    assert not [p for p in (tmp_path / "w2").iterdir() if p.name.startswith(".")]  # no task folders left
    assert all(len(list(iter_jsonl(p))) <= 300 for p in record_shards(tmp_path / "w1"))


# ------------------------------------------------------------------------------------------ readers


def test_jsonl_reader_and_ids(tmp_path):
    src = write(tmp_path / "src" / "a.jsonl", '{"text": "one", "lang": "en"}\n\n{"text": "two"}\n')
    stats, recs, rej = run(src.parent, tmp_path)
    assert [r["text"] for r in recs] == ["one", "two"]
    assert recs[0] == {
        "id": record_id("a.jsonl", line=1),
        "text": "one",
        "meta": {"lang": "en"},
        "source": {"path": "a.jsonl", "line": 1},
    }
    assert recs[1]["source"] == {"path": "a.jsonl", "line": 3}  # physical line numbers, blank lines counted
    assert rej == [] and stats.docs_out == 2
    # a single file as the source: paths are its name
    _, recs_file, _ = run(src, tmp_path)
    assert [r["id"] for r in recs_file] == [r["id"] for r in recs]


def test_json_object_and_list(tmp_path):
    write(tmp_path / "src" / "one.json", '{"text": "solo", "k": 1}')
    write(tmp_path / "src" / "many.json", '[{"text": "a"}, {"text": "b"}, 7]')
    stats, recs, rej = run(tmp_path / "src", tmp_path)
    assert [(r["source"]["path"], r["source"]["index"], r["text"]) for r in recs] == [
        ("many.json", 0, "a"),
        ("many.json", 1, "b"),
        ("one.json", 0, "solo"),
    ]
    assert [(r["path"], r["index"], r["reason"]) for r in rej] == [("many.json", 2, "not_an_object")]


# where orjson (json_parser's fast path) and json part ways: every stage must read these exactly as json does
EDGE_JSON = [
    '{"text": "t", "big": 123456789012345678901234567890, "neg": -9223372036854775809, "u64": 18446744073709551615}',
    '{"text": "t", "nan": NaN, "inf": -Infinity, "huge": 1e400, "tiny": 5e-400}',
    '{"text": "t", "lone": "\\ud800", "pair": "\\ud83d\\ude00", "long": 0.1000000000000000055511151231257827}',
    '{"text": "t", "dup": 1, "other": 0, "dup": 2}',
    "[" * 1100 + "]" * 1100,
]


@pytest.mark.parametrize("text", EDGE_JSON)
def test_json_parser_reads_every_value_as_json_does(text):
    def outcome(parse, data):
        try:
            return repr(parse(data))
        except (ValueError, RecursionError) as e:
            return type(e)

    bad = (text[:-1], text + "}", text.replace('"t"', '"t\x01"'))
    for data in (text, text.encode(), *(b.encode() for b in bad)):
        raw = data if isinstance(data, bytes) else data.encode()
        assert outcome(json_parser(raw), data) == outcome(json.loads, data)


def test_integers_beyond_64_bits_stay_exact_in_the_records(tmp_path):
    line = '{"text": "t", "n": 123456789012345678901234567890}'
    write(tmp_path / "src" / "a.jsonl", line + "\n")
    write(tmp_path / "src" / "b.json", f"[{line}]")
    _, recs, _ = run(tmp_path / "src", tmp_path)
    assert [r["meta"]["n"] for r in recs] == [123456789012345678901234567890] * 2


def test_txt_blocks_and_file_modes(tmp_path):
    write(tmp_path / "src" / "t.txt", "first block\nline two\n\n\n  \nsecond block\n\nthird\n")
    _, recs, _ = run(tmp_path / "src", tmp_path, txt_mode="blocks")
    assert [(r["text"], r["source"]["line"]) for r in recs] == [
        ("first block\nline two", 1),
        ("second block", 6),
        ("third", 8),
    ]
    _, recs, _ = run(tmp_path / "src", tmp_path, txt_mode="file")
    assert [(r["text"], r["source"]) for r in recs] == [
        ("first block\nline two\n\n\n  \nsecond block\n\nthird\n", {"path": "t.txt", "index": 0})
    ]
    with pytest.raises(ValueError):
        RawSettings(txt_mode="paragraphs")


def test_csv_reader(tmp_path):
    write(
        tmp_path / "src" / "c.csv",
        'title,text,author\nA,"multi\nline text",X\n\nB,plain,Y\nC,too,many,fields\nD,last,Z\n',
    )
    stats, recs, rej = run(tmp_path / "src", tmp_path)
    assert [(r["text"], r["meta"], r["source"]["line"]) for r in recs] == [
        ("multi\nline text", {"title": "A", "author": "X"}, 2),
        ("plain", {"title": "B", "author": "Y"}, 5),
        ("last", {"title": "D", "author": "Z"}, 7),
    ]
    assert [(r["line"], r["reason"]) for r in rej] == [(6, "malformed_csv_row")]
    # a configurable text column
    write(tmp_path / "src2" / "c.csv", "body,n\nhello,1\n")
    _, recs, _ = run(tmp_path / "src2", tmp_path, text_field="body")
    assert recs[0]["text"] == "hello" and recs[0]["meta"] == {"n": "1"}


def test_gzip_of_each_reader(tmp_path):
    src = tmp_path / "src"
    write(src / "a.jsonl.gz", gzip.compress(b'{"text": "gz line"}\n'))
    write(src / "b.json.gz", gzip.compress(b'[{"text": "gz json"}]'))
    write(src / "c.txt.gz", gzip.compress(b"gz block\n\ngz block 2\n"))
    write(src / "d.csv.gz", gzip.compress(b"text\ngz csv\n"))
    stats, recs, rej = run(src, tmp_path)
    assert [r["text"] for r in recs] == ["gz line", "gz json", "gz block", "gz block 2", "gz csv"]
    assert recs[0]["source"]["path"] == "a.jsonl.gz" and not rej


def test_skipped_and_hidden_files(tmp_path):
    src = tmp_path / "src"
    write(src / "notes.md", "# not a corpus file")
    write(src / ".hidden.jsonl", '{"text": "hidden"}\n')
    write(src / ".git" / "x.jsonl", '{"text": "hidden too"}\n')
    write(src / "sub" / "z.jsonl", '{"text": "visible"}\n')
    stats, recs, _ = run(src, tmp_path)
    assert [r["text"] for r in recs] == ["visible"]
    assert recs[0]["source"]["path"] == "sub/z.jsonl"
    assert stats.skipped_files == ["notes.md"]


# ------------------------------------------------------------------------------------------ presets and field mapping


def test_chinese_poetry_preset(tmp_path):
    poems = [
        {
            "author": "李白",
            "paragraphs": ["床前明月光，疑是地上霜。", "舉頭望明月，低頭思故鄉。"],
            "title": "靜夜思",
            "id": "u1",
        },
        {"author": "蘇軾", "paragraphs": ["明月幾時有？"], "rhythmic": "水調歌頭", "tags": ["宋词三百首"]},
        {"title": "关雎", "chapter": "国风", "section": "周南", "content": ["关关雎鸠，在河之洲。"]},
        {"title": "某篇", "para": "一整段文字"},
        {"author": "佚名", "paragraphs": [], "title": "空"},
        {"author": "無名", "title": "無詩"},
    ]
    write(tmp_path / "src" / "poet.tang.0.json", json.dumps(poems, ensure_ascii=False))
    stats, recs, rej = run(tmp_path / "src", tmp_path)
    assert recs[0]["text"] == "床前明月光，疑是地上霜。\n舉頭望明月，低頭思故鄉。"
    assert recs[0]["meta"] == {"title": "靜夜思", "author": "李白", "id": "u1"}
    assert recs[1]["meta"] == {"title": "水調歌頭", "title_field": "rhythmic", "author": "蘇軾", "tags": ["宋词三百首"]}
    assert recs[2]["text"] == "关关雎鸠，在河之洲。" and recs[2]["meta"]["chapter"] == "国风"
    assert recs[3]["text"] == "一整段文字"
    assert recs[4]["text"] == ""  # an empty body is a record; cleaning rejects it
    assert [(r["index"], r["reason"]) for r in rej] == [(5, "no_text_field")]


def test_dolma_metadata_is_flattened(tmp_path):
    line = {
        "id": "http://x",
        "text": "doc",
        "source": "common-crawl",
        "metadata": {"url": "http://x", "language": "en", "id": "inner"},
    }
    write(tmp_path / "src" / "cc.jsonl", json.dumps(line) + "\n")
    _, recs, _ = run(tmp_path / "src", tmp_path)
    assert recs[0]["meta"] == {
        "id": "http://x",
        "source": "common-crawl",
        "url": "http://x",
        "language": "en",
        "metadata.id": "inner",
    }
    assert recs[0]["source"] == {"path": "cc.jsonl", "line": 1}


def test_training_layouts_keep_their_fields(tmp_path):
    rows = [
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
        {"prompt": "Q?", "chosen": "good", "rejected": "bad"},
        {"prompt": "P", "responses": ["r1", "r2"], "rewards": [1.0, 0.0]},
        {"messages": "not a list"},
        {"prompt": "P", "responses": ["r1"], "rewards": [1.0, 2.0]},
    ]
    write(tmp_path / "src" / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    _, recs, rej = run(tmp_path / "src", tmp_path)
    assert recs[0]["messages"] == rows[0]["messages"] and recs[0]["text"] == "user: hi\n\nassistant: hello"
    assert (recs[1]["prompt"], recs[1]["chosen"], recs[1]["rejected"]) == ("Q?", "good", "bad")
    assert "good" in recs[1]["text"]
    assert recs[2]["responses"] == ["r1", "r2"] and recs[2]["rewards"] == [1.0, 0.0]
    assert list(recs[0]) == ["id", "text", "meta", "source", "messages"]
    assert [(r["line"], r["reason"]) for r in rej] == [(4, "bad_fields"), (5, "bad_fields")]


# ------------------------------------------------------------------------------------------ bad input


def test_bad_jsonl_lines_are_rejected_with_line_numbers(tmp_path):
    lines = [
        b'{"text": "ok 1"}',
        b'{"text": "cut',
        b'{"body": "no text"}',
        b'{"text": null}',
        b"[1, 2]",
        b'{"text": "caf\xe9"}',
        b'{"text": ""}',
        b'{"text": "lone \\ud800 surrogate"}',
        b'{"text": "ok 2"}',
    ]
    write(tmp_path / "src" / "bad.jsonl", b"\n".join(lines) + b"\n")
    stats, recs, rej = run(tmp_path / "src", tmp_path)
    assert [r["text"] for r in recs] == ["ok 1", "", "ok 2"]  # an empty text is kept (cleaning rejects it)
    assert [(r["line"], r["reason"]) for r in rej] == [
        (2, "malformed_json"),
        (3, "no_text_field"),
        (4, "no_text_field"),
        (5, "not_an_object"),
        (6, "undecodable_bytes"),
        (8, "undecodable_bytes"),
    ]
    assert rej[0]["snippet"] == '{"text": "cut' and rej[0]["path"] == "bad.jsonl"
    assert stats.dropped["malformed_json"] == 1 and stats.dropped["no_text_field"] == 2
    assert stats.rejected_by_reason == {
        "malformed_json": 1,
        "no_text_field": 2,
        "not_an_object": 1,
        "undecodable_bytes": 2,
    }
    assert stats.docs_in == 9 and stats.files[0]["rejected"] == 6


def test_rejected_samples_first_of_each_reason_in_the_stats(tmp_path):
    """The stats keep the batch's first SAMPLES_PER_REASON rejected entries of each reason (file order, whatever
    the worker count), each with its snippet of the bad input, so the asset page shows why records went."""
    for f in range(3):
        bad = [f'{{"text": "cut {f}.{i}' for i in range(6)] + [f'{{"body": "{f}"}}', '{"text": "ok"}']
        write(tmp_path / "src" / f"f{f}.jsonl", "\n".join(bad) + "\n")
    stats, _, rej = run(tmp_path / "src", tmp_path, task_mb=0.0001)  # one task per file
    stats2, _, _ = run(tmp_path / "src", tmp_path, workers=2, task_mb=0.0001)
    samples = stats.rejected_samples
    assert stats.tasks == 3 and samples == stats2.rejected_samples
    malformed = [r for r in rej if r["reason"] == "malformed_json"]
    assert len(malformed) == 18 and samples["malformed_json"] == malformed[:SAMPLES_PER_REASON]
    assert samples["malformed_json"][-1]["snippet"] == '{"text": "cut 1.3'
    assert [s["snippet"] for s in samples["no_text_field"]] == [f'{{"body": "{f}"}}' for f in range(3)]


def test_whole_file_failures(tmp_path):
    src = tmp_path / "src"
    write(src / "a_bad.json", '[\n  {"text": "a"},\n  {"text": "b",}\n]')
    write(src / "b_latin1.json", '[{"text": "caf\u00e9"}]'.encode("latin-1"))
    write(src / "c_latin1.txt", "fine line\n\ncaf\u00e9\n".encode("latin-1"))
    write(src / "d_notgzip.jsonl.gz", b"this is not gzip data")
    full = gzip.compress("".join(json.dumps({"text": f"line {i}"}) + "\n" for i in range(2000)).encode())
    write(src / "e_truncated.jsonl.gz", full[: len(full) // 2])
    os.symlink(src / "does-not-exist.jsonl", src / "f_dangling.jsonl")
    write(src / "g_good.jsonl", '{"text": "still read"}\n')
    stats, recs, rej = run(src, tmp_path)
    by_path = {r["path"]: r for r in rej}
    assert by_path["a_bad.json"]["reason"] == "malformed_json" and by_path["a_bad.json"]["line"] == 3
    assert by_path["b_latin1.json"]["reason"] == "undecodable_bytes"
    assert by_path["c_latin1.txt"]["reason"] == "undecodable_bytes" and by_path["c_latin1.txt"]["line"] == 3
    assert by_path["d_notgzip.jsonl.gz"]["reason"] == "unreadable_file"
    assert by_path["e_truncated.jsonl.gz"]["reason"] == "unreadable_file"
    assert by_path["f_dangling.jsonl"]["reason"] == "unreadable_file"
    truncated = [r for r in recs if r["source"]["path"] == "e_truncated.jsonl.gz"]
    assert 0 < len(truncated) < 2000  # what could be read is kept; the rest is one rejected entry
    assert by_path["e_truncated.jsonl.gz"]["line"] == len(truncated) + 1
    assert [r["text"] for r in recs if r["source"]["path"] == "g_good.jsonl"] == ["still read"]
    assert not any(r["source"]["path"] in ("c_latin1.txt", "b_latin1.json") for r in recs)
    assert stats.rejected_by_reason["unreadable_file"] == 3


# ------------------------------------------------------------------------------------------ the real corpus


def test_full_tang_poems(shared_dir, tmp_path):
    tang = shared_dir / "corpora" / "chinese-poetry" / "全唐诗"
    if not tang.is_dir():
        pytest.skip("chinese-poetry corpus not present")
    stats = ingest(tang, tmp_path / "out", RawSettings(), workers=2)
    assert stats.docs_out == 57_607
    assert stats.rejected_by_reason == {}
    assert all(f["path"].startswith("poet.tang.") for f in stats.files) and len(stats.files) == 58
    first = next(iter_jsonl(record_shards(tmp_path / "out")[0]))
    assert first["meta"]["author"] and first["meta"]["title"] and first["source"]["index"] == 0


def test_data_root_inside_source_is_not_ingested(tmp_path):
    src = tmp_path / "corpus"
    (src / "data" / "raw_records").mkdir(parents=True)
    (src / "a.jsonl").write_text('{"text": "a real document"}\n', encoding="utf-8")
    (src / "data" / "raw_records" / "part-00000.jsonl").write_text('{"text": "our own output"}\n', encoding="utf-8")
    out = tmp_path / "out"
    stats = ingest(src, out, RawSettings(), workers=1, exclude=src / "data")
    assert stats.docs_out == 1
    texts = [r["text"] for shard in sorted(out.glob("part-*.jsonl")) for r in iter_jsonl(shard)]
    assert texts == ["a real document"]


def test_json_values_that_are_not_objects_are_rejected(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('"a bare JSON string"\n42\n{"text": "a real record"}\n', encoding="utf-8")
    (src / "b.json").write_text('[{"text": "kept"}, "bare string", 5, null]', encoding="utf-8")
    out = tmp_path / "out"
    stats = ingest(src, out, RawSettings(), workers=1)
    texts = sorted(r["text"] for shard in sorted(out.glob("part-*.jsonl")) for r in iter_jsonl(shard))
    assert texts == ["a real record", "kept"]
    assert stats.dropped["not_an_object"] == 5 and stats.docs_in == stats.docs_out + stats.rejected


# ------------------------------------------------------------------------------------------ hostile input
# Each runs ingest in a child process that reports its own peak RSS, with a timeout: a hang or a blow-up fails.

HOSTILE_RSS_MB = 400
# the child's own peak: VmHWM, since Linux carries ru_maxrss across fork + exec (it would report pytest's size)
_CHILD = """
import json, re, resource, sys
from pathlib import Path
from tokenmill.stages.raw import RawSettings, ingest
ingest(Path(sys.argv[1]), Path(sys.argv[2]), RawSettings(**json.loads(sys.argv[3])), workers=1)
try:
    print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) / 1024)
except OSError:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def ingest_in_child(source: Path, out: Path, timeout: float = 60, **settings) -> tuple[dict, list[dict], float]:
    """(stats, rejected entries, peak RSS in MiB) of ingest run in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), str(out), json.dumps(settings)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    stats = read_result(out, RawResult)
    assert stats.docs_in == stats.docs_out + stats.rejected
    return stats, rejected(out), float(res.stdout.split()[-1])


def write_gzip_bomb(path: Path, zeros: int) -> None:
    """`zeros` zero bytes as a gzip file of concatenated members (each 1 MiB compressed once): ~1 KB per MiB."""
    member = gzip.compress(bytes(1 << 20), compresslevel=9)
    with open(path, "wb") as f:
        for _ in range(zeros >> 20):
            f.write(member)


def test_fifo_and_socket_are_skipped_not_opened(tmp_path):
    import socket

    src = tmp_path / "src"
    write(src / "good.jsonl", '{"text": "a real record"}\n')
    os.mkfifo(src / "pipe.jsonl")  # opening it for reading would block until a writer comes: forever
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "sock.txt"))
    try:
        stats, rej, rss = ingest_in_child(src, tmp_path / "out", timeout=60)
    finally:
        sock.close()
    assert stats.docs_out == 1 and stats.rejected_by_reason == {"not_a_regular_file": 2}
    by_path = {r["path"]: r for r in rej}
    assert "a FIFO" in by_path["pipe.jsonl"]["detail"] and "a socket" in by_path["sock.txt"]["detail"]
    assert by_path["pipe.jsonl"]["line"] is None  # the whole file
    assert rss < HOSTILE_RSS_MB


def test_deep_nesting_is_malformed_not_a_crash(tmp_path):
    src = tmp_path / "src"
    deep = "[" * 950 + "]" * 950
    write(
        src / "a.jsonl",
        '{"text": "ok 1"}\n'
        f'{{"text": "deep meta", "tags": {deep}}}\n'
        f'{{"text": "just too deep", "tags": {"[" * 100 + "]" * 100}}}\n'
        f'{{"text": "deep enough", "tags": {"[" * 98 + "]" * 98}}}\n',
    )
    write(src / "b.json", f'[{{"text": "kept"}}, {{"text": "deep", "x": {deep}}}]')
    write(src / "c.json", deep)
    stats, rej, rss = ingest_in_child(src, tmp_path / "out")
    assert sorted(r["text"] for r in records(tmp_path / "out")) == ["deep enough", "kept", "ok 1"]
    assert sorted((r["path"], r.get("line", r.get("index")), r["reason"]) for r in rej) == [
        ("a.jsonl", 2, "malformed_json"),
        ("a.jsonl", 3, "malformed_json"),
        ("b.json", 1, "malformed_json"),
        ("c.json", 0, "malformed_json"),
    ]
    assert all("nested deeper than 100 levels" in r["detail"] for r in rej)
    assert rss < HOSTILE_RSS_MB


def test_nesting_depth_counts_containers_not_brackets_in_strings():
    from tokenmill.stages.raw.stream import nesting_depth, too_deep

    values = [
        "plain",
        [],
        {"a": [1, {"b": []}]},
        {"text": "[[[{{{", "k[": ['\\"]]', "\\", '"{']},
        [["]"], [[["\\\\["]]]],
        json.loads("[" * 150 + "]" * 150),
    ]
    for v in values:
        depth = nesting_depth(json.dumps(v, ensure_ascii=False).encode())
        assert not too_deep(v, depth) and (depth == 0 or too_deep(v, depth - 1)), v


def test_json_brackets_inside_strings_do_not_make_a_record_deep(tmp_path):
    src = tmp_path / "src"
    nested = "[" * 99 + "]" * 99  # a record 100 levels deep: the most allowed
    write(src / "a.json", json.dumps([{"text": "[" * 300, "x": json.loads(nested)}, {"text": "ok"}]))
    ingest(src, tmp_path / "out", workers=1)
    assert [r["text"] for r in records(tmp_path / "out")] == ["[" * 300, "ok"]


def test_gzip_bomb_stops_at_the_limits(tmp_path):
    src = tmp_path / "src"
    write(src / "a_good.jsonl.gz", gzip.compress(b'{"text": "before the bomb"}\n'))
    write_gzip_bomb(src / "bomb.jsonl.gz", 1 << 30)  # 1 GiB of zeros in ~1 MB: one endless line
    write_gzip_bomb(src / "bomb.json.gz", 256 << 20)
    assert (src / "bomb.jsonl.gz").stat().st_size < 2 << 20
    # defaults: the endless line is skipped in chunks, never held (record_too_large)
    stats, rej, rss = ingest_in_child(src, tmp_path / "out", timeout=120)
    reasons = {r["path"]: r["reason"] for r in rej}
    assert reasons == {"bomb.jsonl.gz": "record_too_large", "bomb.json.gz": "record_too_large"}
    assert [r["text"] for r in records(tmp_path / "out")] == ["before the bomb"]
    assert rss < HOSTILE_RSS_MB
    # a per-file limit stops decompressing there (file_too_large), whatever the lines look like
    stats, rej, rss = ingest_in_child(src, tmp_path / "out2", max_file_bytes=64 << 20, max_record_bytes=1 << 20)
    reasons = {r["path"]: r["reason"] for r in rej}
    assert reasons == {"bomb.jsonl.gz": "file_too_large", "bomb.json.gz": "record_too_large"}
    assert "max_file_bytes (67108864)" in next(r["detail"] for r in rej if r["path"] == "bomb.jsonl.gz")
    assert rss < HOSTILE_RSS_MB


def test_a_200_mb_line_is_skipped_at_bounded_memory(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "big.jsonl", "wb") as f:
        f.write(b'{"text": "')
        block = b"x" * (1 << 20)
        for _ in range(200):
            f.write(block)
        f.write(b'"}\n{"text": "the next line is read"}\n')
    stats, rej, rss = ingest_in_child(src, tmp_path / "out")
    assert [(r["line"], r["reason"]) for r in rej] == [(1, "record_too_large")]
    assert rej[0]["snippet"].startswith('{"text": "xxx') and "max_record_bytes" in rej[0]["detail"]
    assert [(r["text"], r["source"]["line"]) for r in records(tmp_path / "out")] == [("the next line is read", 2)]
    assert rss < HOSTILE_RSS_MB


def test_symlinks_leaving_the_source_are_refused(tmp_path):
    outside = write(tmp_path / "outside" / "secret.txt", "root:x:0:0:root:/root:/bin/bash\n")
    src = tmp_path / "src"
    write(src / "real.txt", "a document\n")
    os.symlink(outside, src / "passwd.txt")
    os.symlink(src / "real.txt", src / "alias.txt")  # inside the source: read
    stats, rej, rss = ingest_in_child(src, tmp_path / "out")
    assert [(r["path"], r["reason"]) for r in rej] == [("passwd.txt", "outside_source")]
    assert "follow_outside_symlinks" in rej[0]["detail"]
    assert sorted(r["source"]["path"] for r in records(tmp_path / "out")) == ["alias.txt", "real.txt"]
    assert rss < HOSTILE_RSS_MB
    stats, rej, _ = ingest_in_child(src, tmp_path / "out2", follow_outside_symlinks=True)
    assert not rej and "root:x:0:0:root:/root:/bin/bash" in [r["text"] for r in records(tmp_path / "out2")]


def test_record_limit_in_every_reader(tmp_path):
    src = tmp_path / "src"
    long = "y" * 300
    write(src / "a.jsonl", f'{{"text": "{long}"}}\n{{"text": "short"}}\n')
    write(src / "b.csv", f"text\n{long}\nshort csv\n")
    write(src / "c.txt", f"short block\n\n{long}\nmore of it\n\nlast block\n")
    write(src / "d.json", f'[{{"text": "{long}"}}]')
    stats, recs, rej = run(src, tmp_path, max_record_bytes=200)
    assert [r["text"] for r in recs] == ["short", "short csv", "short block", "last block"]
    assert [(r["path"], r["line"], r["reason"]) for r in rej] == [
        ("a.jsonl", 1, "record_too_large"),
        ("b.csv", 2, "record_too_large"),
        ("c.txt", 3, "record_too_large"),
        ("d.json", None, "record_too_large"),
    ]
    with pytest.raises(ValueError, match="max_record_bytes"):
        RawSettings(max_record_bytes=100, max_file_bytes=10)
