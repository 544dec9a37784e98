"""raw_records on .parquet and .zst inputs: bounded batches, the same mapping as JSON, bad input rejected."""

import datetime
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support import BATCH, materialize_batch

from assets.raw import raw_records
from tokenmill.common.io import REJECTED_FILE, iter_jsonl, record_id, record_shards
from tokenmill.common.results import read_result
from tokenmill.stages.clean import CleanSettings, clean_corpus
from tokenmill.stages.clean.language import identify_languages
from tokenmill.stages.raw import RawSettings, ingest
from tokenmill.stages.raw.read_parquet import read_parquet
from tokenmill.stages.raw.stream import Found, zstd


def run(source: Path, out: Path, workers: int = 1, **settings) -> tuple[dict, list[dict], list[dict]]:
    stats = ingest(source, out, RawSettings(**settings), workers=workers)
    assert read_result(out, type(stats)) == stats
    recs = [r for shard in record_shards(out) for r in iter_jsonl(shard)]
    rej = [json.loads(line) for line in (out / REJECTED_FILE).read_text(encoding="utf-8").splitlines()]
    assert stats.docs_in == stats.docs_out + stats.rejected == len(recs) + len(rej)
    return stats, recs, rej


def jsonl_bytes(rows: list[dict]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()


def pages(n: int, width: int = 1) -> list[dict]:
    return [
        {"id": f"doc-{i}", "text": f"page {i} " + "word " * width, "url": f"https://example.org/{i}"} for i in range(n)
    ]


@pytest.fixture
def src(tmp_path) -> Path:
    """The source folder (outputs go beside it, never inside)."""
    (tmp_path / "src").mkdir()
    return tmp_path / "src"


# ------------------------------------------------------------------------------------------ parquet


def test_parquet_row_groups_are_read_in_bounded_batches_in_order(src, tmp_path, monkeypatch):
    rows = pages(20_000, width=400)  # ~2 KB a row, 2 row groups of 20 MB decoded
    path = src / "web.parquet"
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, path, row_group_size=10_000)
    decoded = table.nbytes
    del table
    batches, iter_batches = [], pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        for batch in iter_batches(self, *args, **kwargs):
            batches.append(batch.num_rows)
            yield batch

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    before, peak = pa.total_allocated_bytes(), 0
    for item in read_parquet(str(path), None, RawSettings(parquet_batch_rows=100)):
        assert isinstance(item, Found)
        peak = max(peak, pa.total_allocated_bytes())
        assert (item.key, item.value) == ("index", rows[item.at])
        assert len(batches) == item.at // 100 + 1  # yielded before the next batch is decoded
    assert max(batches) == 100 and sum(batches) == 20_000
    # Arrow memory: a batch, the page buffer, a page (measured 5.3 MB), not a row group (20 MB) or the file
    assert peak - before < decoded / 5

    stats, recs, rej = run(src, tmp_path / "out", parquet_batch_rows=100)
    assert not rej and [r["text"] for r in recs] == [r["text"] for r in rows]
    assert [r["source"] for r in recs] == [{"path": "web.parquet", "index": i} for i in range(20_000)]
    assert recs[7]["id"] == record_id("web.parquet", index=7)
    assert recs[7]["meta"] == {"id": "doc-7", "url": "https://example.org/7"}


def test_parquet_rows_map_like_json_objects(src, tmp_path):
    """text_field, presets and meta behave as for the same objects in JSONL: only `source` and `id` differ."""
    rows = [
        {"content": "body one", "title": "T", "tags": ["a", "b"], "info": {"lang": "en", "score": 0.5}, "n": 1},
        {"content": None, "title": "no text", "tags": [], "info": {"lang": "fr", "score": 1.0}, "n": 2},
        {"content": "body three", "title": None, "tags": ["c"], "info": {"lang": "de", "score": 0.25}, "n": 3},
    ]
    poems = [{"title": "静夜思", "author": "李白", "paragraphs": ["床前明月光，", "疑是地上霜。"]}]
    for name, table in (("rows", rows), ("poems", poems)):
        pq.write_table(pa.Table.from_pylist(table), src / f"{name}.parquet")
        (src / f"{name}.jsonl").write_bytes(jsonl_bytes(table))
    _, recs, rej = run(src, tmp_path / "out", text_field="content")

    def by_format(ext):
        recs_of = [
            (r["source"]["path"].split(".")[0], r["text"], r["meta"]) for r in recs if r["source"]["path"].endswith(ext)
        ]
        rej_of = [(r["path"].split(".")[0], r["reason"], r["detail"]) for r in rej if r["path"].endswith(ext)]
        return recs_of, rej_of

    assert by_format(".parquet") == by_format(".jsonl")
    assert [(r["path"], r["index"], r["reason"]) for r in rej if r["path"].endswith(".parquet")] == [
        ("rows.parquet", 1, "no_text_field")
    ]
    poem = next(r for r in recs if r["source"]["path"] == "poems.parquet")
    assert poem["text"] == "床前明月光，\n疑是地上霜。" and poem["meta"] == {"title": "静夜思", "author": "李白"}


def test_a_fineweb_language_column_is_kept_beside_the_identified_language(src, tmp_path):
    """raw_records has no meta_fields setting (JSON has none either: every field but the text goes to meta), so
    FineWeb's `language` / `language_score` columns reach meta.language; cleaned_jsonl's identification keeps them
    as meta.source_language / source_language_score instead of overwriting them unseen."""
    text = "Le chat dort sur le canapé du salon pendant que la pluie tombe doucement sur la ville."
    row = {"text": text, "id": "<urn:uuid:1>", "url": "https://example.fr/", "language": "en", "language_score": 0.8}
    pq.write_table(pa.Table.from_pylist([row]), src / "fineweb.parquet")
    _, (rec,), _ = run(src, tmp_path / "raw")
    assert rec["meta"] == {"id": "<urn:uuid:1>", "url": "https://example.fr/", "language": "en", "language_score": 0.8}
    clean_corpus(tmp_path / "raw", tmp_path / "clean", CleanSettings(quality="curated"), workers=1)
    ((cleaned,),) = [list(iter_jsonl(shard)) for shard in record_shards(tmp_path / "clean")]
    ((language, score),) = identify_languages([text])
    assert language == "fr" and cleaned["meta"] == {
        "id": "<urn:uuid:1>",
        "url": "https://example.fr/",
        "source_language": "en",
        "source_language_score": 0.8,
        "language": "fr",
        "language_score": score,
    }


def test_parquet_timestamps_binary_and_nested_columns_serialize_deterministically(src, tmp_path):
    when = datetime.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=datetime.timezone.utc)
    table = pa.table(
        {
            "text": ["a page"],
            "crawled": pa.array([when], pa.timestamp("us", tz="UTC")),
            "fetched_ns": pa.array([1_700_000_000_123_456_789], pa.timestamp("ns")),
            "day": pa.array([datetime.date(2024, 5, 6)], pa.date32()),
            "raw": pa.array([b"\xff\x00"], pa.binary()),
            "headers": pa.array([[("content-type", "text/html")]], pa.map_(pa.string(), pa.string())),
            "meta": pa.array([{"lang": "en", "seen": [when]}]),
        }
    )
    pq.write_table(table, src / "a.parquet")
    _, first, _ = run(src, tmp_path / "out-1")
    _, second, _ = run(src, tmp_path / "out-2")
    assert first == second
    assert first[0]["meta"] == {
        "crawled": "2024-05-06T07:08:09.123456+00:00",
        "fetched_ns": "2023-11-14T22:13:20.123456789",
        "day": "2024-05-06",
        "raw": {"base64": "/wA="},
        "headers": [["content-type", "text/html"]],
        "meta": {"lang": "en", "seen": ["2024-05-06T07:08:09.123456+00:00"]},
    }


def test_parquet_without_its_text_column_is_rejected_whole_naming_the_columns(src, tmp_path):
    pq.write_table(pa.Table.from_pylist([{"body": f"b{i}", "url": "u"} for i in range(42)]), src / "a.parquet")
    (src / "b.jsonl").write_text('{"text": "still read"}\n')
    stats, recs, rej = run(src, tmp_path / "out")
    assert [r["text"] for r in recs] == ["still read"]
    assert [(r["path"], r["index"], r["reason"]) for r in rej] == [("a.parquet", None, "no_text_field")]
    assert "no 'text' column (columns: body, url)" in rej[0]["detail"] and "42 rows" in rej[0]["detail"]
    _, recs, rej = run(src, tmp_path / "out-body", text_field="body")
    assert len(recs) == 42 and not [r for r in rej if r["path"] == "a.parquet"]


def test_a_file_named_parquet_that_is_not_parquet_is_rejected(src, tmp_path):
    (src / "a.parquet").write_text('{"text": "json, not parquet"}\n')
    full = src / "full.parquet"
    pq.write_table(pa.Table.from_pylist(pages(10)), full)
    (src / "b_truncated.parquet").write_bytes(full.read_bytes()[:-20])  # the footer cut
    _, recs, rej = run(src, tmp_path / "out")
    assert len(recs) == 10 and {r["source"]["path"] for r in recs} == {"full.parquet"}
    assert [(r["path"], r["index"], r["reason"]) for r in rej] == [
        ("a.parquet", None, "unreadable_file"),
        ("b_truncated.parquet", None, "unreadable_file"),
    ]
    assert all("not a Parquet file, or its footer is corrupt" in r["detail"] for r in rej)


def test_a_corrupt_row_group_loses_its_rows_only(src, tmp_path):
    rows = pages(3000, width=5)
    path = src / "a.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=1000, compression="snappy")
    chunk = pq.ParquetFile(path).metadata.row_group(1).column(1)  # the text column of the second group
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    for k in range(start + 40, start + chunk.total_compressed_size - 40, 7):
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))
    _, recs, rej = run(src, tmp_path / "out", parquet_batch_rows=250)
    assert [r["source"]["index"] for r in recs] == list(range(1000)) + list(range(2000, 3000))
    assert [(r["index"], r["reason"]) for r in rej] == [(1000, "unreadable_file")]
    assert "row group 1" in rej[0]["detail"] and "1000 rows" in rej[0]["detail"]


# ------------------------------------------------------------------------------------------ zstd


def test_zstd_jsonl_single_and_multi_frame_read_like_plain(src, tmp_path):
    data = jsonl_bytes(pages(3000))
    (src / "plain.jsonl").write_bytes(data)
    (src / "single.jsonl.zst").write_bytes(zstd.compress(data))
    cut = [0, 1000, 70_000, len(data) // 2, len(data)]  # Dolma-style: frames cut anywhere, even inside a line
    (src / "multi.ndjson.zst").write_bytes(b"".join(zstd.compress(data[a:b]) for a, b in zip(cut, cut[1:])))
    (src / "tiny.json.zst").write_bytes(zstd.compress(b'[{"text": "one"}, {"text": "two"}]'))
    (src / "tiny.txt.zst").write_bytes(zstd.compress(b"block one\n\nblock two\n"))
    (src / "tiny.csv.zst").write_bytes(zstd.compress(b"text,n\nrow one,1\n"))
    _, recs, rej = run(src, tmp_path / "out")
    assert not rej

    def of(path):
        return [(r["text"], r["meta"], r["source"]["line"]) for r in recs if r["source"]["path"] == path]

    assert of("single.jsonl.zst") == of("multi.ndjson.zst") == of("plain.jsonl") and len(of("plain.jsonl")) == 3000
    assert [r["text"] for r in recs if r["source"]["path"].startswith("tiny")] == [
        "row one",
        "one",
        "two",
        "block one",
        "block two",
    ]


def test_corrupt_or_truncated_zstd_keeps_the_records_before(src, tmp_path):
    good = jsonl_bytes(pages(500))
    frames = [zstd.compress(good), zstd.compress(jsonl_bytes(pages(500)))]
    broken = bytearray(frames[1])
    broken[4:40] = bytes(36)  # the second frame's header and first block header zeroed
    (src / "a_corrupt.jsonl.zst").write_bytes(frames[0] + bytes(broken))
    (src / "b_truncated.jsonl.zst").write_bytes(frames[0] + frames[1][: len(frames[1]) // 2])
    (src / "c_not_zstd.jsonl.zst").write_bytes(good)
    (src / "d.jsonl").write_text('{"text": "still read"}\n')
    _, recs, rej = run(src, tmp_path / "out")
    counts = {p: sum(r["source"]["path"] == p for r in recs) for p in ("a_corrupt.jsonl.zst", "b_truncated.jsonl.zst")}
    assert counts == {"a_corrupt.jsonl.zst": 500, "b_truncated.jsonl.zst": 500}
    assert [r["text"] for r in recs if r["source"]["path"] == "d.jsonl"] == ["still read"]
    by_path = {r["path"]: r for r in rej}
    assert sorted(by_path) == ["a_corrupt.jsonl.zst", "b_truncated.jsonl.zst", "c_not_zstd.jsonl.zst"]
    assert all(r["reason"] == "unreadable_file" for r in rej)
    assert by_path["a_corrupt.jsonl.zst"]["line"] == by_path["b_truncated.jsonl.zst"]["line"] == 501
    assert by_path["c_not_zstd.jsonl.zst"]["line"] is None
    assert "EOFError" in by_path["b_truncated.jsonl.zst"]["detail"]
    assert all("near compressed byte" in r["detail"] and "decompressed bytes" in r["detail"] for r in rej)


def test_zstd_bomb_stops_at_max_file_bytes(src, tmp_path):
    frame = zstd.compress(bytes(64 << 20))  # 64 MiB of zeros in a few KB
    with open(src / "bomb.jsonl.zst", "wb") as f:
        f.write(zstd.compress(b'{"text": "before the bomb"}\n'))
        for _ in range(16):  # 1 GiB decompressed
            f.write(frame)
    assert (src / "bomb.jsonl.zst").stat().st_size < 1 << 20
    _, recs, rej = run(src, tmp_path / "out", max_file_bytes=8 << 20, max_record_bytes=1 << 20)
    assert [r["text"] for r in recs] == ["before the bomb"]
    assert [(r["line"], r["reason"]) for r in rej] == [(2, "file_too_large")]
    assert "max_file_bytes (8388608)" in rej[0]["detail"]


# ------------------------------------------------------------------------------------------ a mixed folder


@pytest.mark.timeout(120)
def test_mixed_folder_counts_and_worker_count_do_not_change_outputs(src, tmp_path):
    (src / "parquet").mkdir()
    (src / "zst").mkdir()
    pq.write_table(pa.Table.from_pylist(pages(1200)), src / "parquet" / "a.parquet", row_group_size=500)
    pq.write_table(pa.Table.from_pylist([{"body": "no text"}] * 3), src / "parquet" / "b_notext.parquet")
    (src / "parquet" / "c_fake.parquet").write_text("nope")
    (src / "zst" / "d.jsonl.zst").write_bytes(zstd.compress(jsonl_bytes(pages(800)) + b"{not json\n[1]\n"))
    (src / "e.jsonl").write_bytes(jsonl_bytes(pages(300)) + b'{"no": "text"}\n')
    one, recs, rej = run(src, tmp_path / "w1", workers=1, task_mb=0.01, records_per_shard=400)
    assert one.docs_out == 1200 + 800 + 300 and one.tasks > 1
    assert one.rejected_by_reason == {
        "malformed_json": 1,
        "no_text_field": 2,
        "not_an_object": 1,
        "unreadable_file": 1,
    }
    assert one.docs_in == one.docs_out + one.rejected == 2300 + 5
    two, _, _ = run(src, tmp_path / "w2", workers=2, task_mb=0.01, records_per_shard=400)
    for name in [p.name for p in record_shards(tmp_path / "w1")] + [REJECTED_FILE]:
        assert (tmp_path / "w1" / name).read_bytes() == (tmp_path / "w2" / name).read_bytes()
    # the asset: the same files, its metadata in = out + rejected
    config = {"task_mb": 0.01, "records_per_shard": 400, "parquet_batch_rows": 128}
    result = materialize_batch([raw_records], tmp_path / "data", src, {"ops": {"raw_records": {"config": config}}})
    meta = result.asset_materializations_for_node("raw_records")[0].metadata
    assert (meta["docs_in"].value, meta["docs_out"].value) == (one.docs_in, one.docs_out)
    assert meta["docs_in"].value == meta["docs_out"].value + sum(meta["rejected_by_reason"].value.values())
    batch = tmp_path / "data" / "raw_records" / BATCH
    for name in [p.name for p in record_shards(tmp_path / "w1")] + [REJECTED_FILE]:
        assert (tmp_path / "w1" / name).read_bytes() == (batch / name).read_bytes()
