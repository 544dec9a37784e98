"""The dedup index and per-batch dedup: batches added one by one keep what one build with keep=first_seen keeps,
an earlier batch's record is never removed, records are conserved, outputs are identical for any worker count."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from support import dedup_record, random_poem, substitute, write_records

from tokenmill.common import text_keys
from tokenmill.common.io import (
    REMOVED_FILE,
    ZSTD_BLOCK,
    BlockReader,
    iter_jsonl,
    read_json,
    record_shards,
    write_zstd_blocks,
)
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.stages.dedup import (
    CLUSTERS_FILE,
    REPORT_FILE,
    DedupApplyResult,
    DedupResult,
    DedupSettings,
    Partitions,
    build_dedup_report,
    cluster_parts,
    dedup_batch,
    index,
    write_deduped,
)
from tokenmill.stages.dedup import keys as K
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.buckets import ORDER_ROWS
from tokenmill.stages.dedup.index import SEGMENT_FILE

WORDS = "river stone light morning harbor window garden silver quiet letter winter orchard lantern meadow".split()


def _prose(rng: random.Random, words: int = 24) -> str:
    """Latin text of about 150 characters (3-grams: its key is over 100 characters)."""
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _swap_word(text: str, k: int, word: str = "copper") -> str:
    parts = text.split(" ")
    parts[k] = word
    return " ".join(parts)


def _batches(seed: int = 0) -> tuple[list[list[dict]], dict]:
    """Three batches of CJK poems and Latin prose with planted duplicates within and across batches; `plan` names
    the planted cases by role."""
    rng = random.Random(seed)
    poems = [random_poem(rng, 40) for _ in range(60)]
    prose = [_prose(rng) for _ in range(40)]
    chain_a = random_poem(rng, 40)
    chain_b = substitute(chain_a, 10)  # J(a, b) = 0.90 (2-grams)
    chain_c = substitute(substitute(chain_b, 25), 32)  # J(b, c) = 0.81, J(a, c) = 0.73 < 0.8
    batches: list[list[dict]] = [[], [], []]
    plan: dict[str, str] = {}

    def add(b: int, text: str, role: str | None = None, meta: dict | None = None) -> None:
        path = f"b{b}/{'poems' if b % 2 else 'prose'}.json"
        rec = dedup_record(path, len(batches[b]), text, meta)
        batches[b].append(rec)
        if role:
            plan[role] = rec["id"]

    for i, t in enumerate(poems[:40]):
        add(0, t, f"poem{i}")
    for i, t in enumerate(prose[:25]):
        add(0, t, f"prose{i}")
    add(0, f"{poems[0][:20]}，{poems[0][20:]}。", "exact_within_1")  # exact copy within batch 1
    add(0, substitute(poems[1], 5), "near_within_1")
    add(0, chain_a, "chain_a")
    # batch 2: copies of batch 1, its own new records and their copies, the chain's middle link
    add(1, poems[2], "exact_cross_2")
    add(1, _swap_word(prose[3], 7).upper(), "near_cross_2")  # case folded away by the key, one word replaced
    add(1, substitute(poems[1], 30), "near_of_removed_2")  # near poems[1] (kept) and near_within_1 (removed)
    add(1, poems[1][:5] + "龍" + poems[1][6:], "exact_of_removed_2")  # the key of near_within_1, removed in batch 1
    add(1, chain_b, "chain_b")
    for i, t in enumerate(poems[40:55]):
        add(1, t, f"poem{40 + i}")
    for i, t in enumerate(prose[25:35]):
        add(1, t, f"prose{25 + i}")
    add(1, poems[41] + "！", "exact_within_2")
    add(1, _swap_word(prose[26], 3), "near_within_2")
    # batch 3: the chain's last link, copies of batch 2's removed and kept records, new records
    add(2, chain_c, "chain_c")
    add(2, substitute(poems[2], 30), "near_cross_3")
    add(2, substitute(poems[1], 30) + "。", "exact_of_cross_removed_3")  # key of near_of_removed_2
    add(2, poems[42], "exact_cross_3")
    for i, t in enumerate(poems[55:]):
        add(2, t, f"poem{55 + i}")
    for i, t in enumerate(prose[35:]):
        add(2, t, f"prose{35 + i}")
    add(2, _swap_word(prose[36], 10), "near_within_3")
    return batches, plan


def _run_batches(
    root: Path, batches: list[list[dict]], settings: DedupSettings, **kw
) -> list[tuple[DedupResult, DedupApplyResult]]:
    """dedup_batch then write_deduped per batch under root/<asset>/<batch>; returns each batch's two results."""
    out = []
    for b, records in enumerate(batches):
        key = f"g1-b{b + 1:04d}"
        cleaned = write_records(root / "cleaned" / key, records, per_shard=40)
        segments = [root / "index" / f"g1-b{k + 1:04d}" for k in range(b)]
        stats = dedup_batch(cleaned, segments, root / "report" / key, root / "index" / key, settings, **kw)
        applied = write_deduped(cleaned, root / "report" / key, root / "deduped" / key, workers=kw.get("workers"))
        out.append((stats, applied))
    return out


def _decisions(folders: list[Path]) -> tuple[set, dict]:
    """(kept ids, {removed id: (duplicate_of, level, similarity)}) over deduped folders."""
    kept = {r["id"] for f in folders for shard in record_shards(f) for r in iter_jsonl(shard)}
    removed = {
        r["id"]: (r["duplicate_of"], r["level"], r["similarity"]) for f in folders for r in iter_jsonl(f / REMOVED_FILE)
    }
    return kept, removed


def test_batches_keep_what_one_first_seen_build_keeps(tmp_path):
    batches, plan = _batches()
    settings = DedupSettings(keep="first_seen", chunk_bytes=2000)
    stats = [s.incremental for s, _ in _run_batches(tmp_path / "inc", batches, settings, workers=1)]
    keys = sorted((tmp_path / "inc" / "deduped").iterdir())
    kept, removed = _decisions(keys)

    write_records(tmp_path / "all", [r for b in batches for r in b], per_shard=40)
    build_dedup_report(tmp_path / "all", tmp_path / "rep", settings, workers=1)
    write_deduped(tmp_path / "all", tmp_path / "rep", tmp_path / "out", workers=1)
    assert (kept, removed) == _decisions([tmp_path / "out"])

    expected = {
        "exact_within_1": (plan["poem0"], "exact"),
        "near_within_1": (plan["poem1"], "near"),
        "exact_cross_2": (plan["poem2"], "exact"),
        "near_cross_2": (plan["prose3"], "near"),
        "near_of_removed_2": (plan["poem1"], "near"),
        "exact_of_removed_2": (plan["near_within_1"], "exact"),  # an exact copy names the record with its key
        "chain_b": (plan["chain_a"], "near"),
        "exact_within_2": (plan["poem41"], "exact"),
        "near_within_2": (plan["prose26"], "near"),
        "near_cross_3": (plan["poem2"], "near"),
        "exact_of_cross_removed_3": (plan["near_of_removed_2"], "exact"),
        "exact_cross_3": (plan["poem42"], "exact"),
        "near_within_3": (plan["prose36"], "near"),
    }
    assert {plan[role]: want for role, want in expected.items()} == {i: r[:2] for i, r in removed.items()}
    assert plan["chain_c"] in kept  # only within the threshold of chain_b, which batch 2 removed
    assert all(r[2] >= 0.8 for r in removed.values())
    # the split: what batch 3 removed against the index vs within itself
    assert (stats[2]["dropped_exact_cross_batch"], stats[2]["dropped_near_cross_batch"]) == (2, 1)
    assert (stats[2]["dropped_exact_within_batch"], stats[2]["dropped_near_within_batch"]) == (0, 1)
    report = read_json(tmp_path / "inc" / "report" / "g1-b0003" / REPORT_FILE)
    assert "first_seen" in report["incremental"]["keep_rule"] and report["incremental"]["cross_batch"]
    roles = {
        m["role"]
        for line in iter_jsonl(tmp_path / "inc" / "report" / "g1-b0003" / CLUSTERS_FILE)
        for m in line["members"]
    }
    assert roles == {"indexed", "kept", "removed"}


def test_counts_add_up_and_no_exact_duplicate_across_batches(tmp_path):
    batches, _ = _batches(seed=1)
    runs = _run_batches(tmp_path, batches, DedupSettings(keep="first_seen"), workers=1)
    stats = [s for s, _ in runs]
    for (s, applied), records in zip(runs, batches):
        split = s.incremental
        assert s.docs_in == len(records) == s.docs_out + s.dropped["exact_duplicate"] + s.dropped["near_duplicate"]
        assert s.dropped["exact_duplicate"] == split["dropped_exact_cross_batch"] + split["dropped_exact_within_batch"]
        assert s.dropped["near_duplicate"] == split["dropped_near_cross_batch"] + split["dropped_near_within_batch"]
        assert (applied.docs_in, applied.docs_out, applied.dropped) == (s.docs_in, s.docs_out, s.dropped)
        # indexed: every record but the exact duplicates; with LSH data: the kept ones
        assert split["index_records_added"] == s.docs_in - s.dropped["exact_duplicate"]
        assert split["index_kept_added"] == s.docs_out
    added = [s.incremental["index_records_added"] for s in stats]
    assert [s.incremental["index_records"] for s in stats] == [0, added[0], added[0] + added[1]]
    total_in = sum(len(b) for b in batches)
    assert total_in == sum(s.docs_out + s.dropped["exact_duplicate"] + s.dropped["near_duplicate"] for s in stats)
    kept_texts = [
        r["text"] for f in sorted((tmp_path / "deduped").iterdir()) for sh in record_shards(f) for r in iter_jsonl(sh)
    ]
    digests = [K.key_digest(k) for k in text_keys.dedup_keys(kept_texts)]
    assert len(set(digests)) == len(digests) == sum(s.docs_out for s in stats)


def _rewrite_as_format(version: int, task: index.SegmentTask) -> None:
    """Rewrites a segment chunk just written (format 4) in the files an earlier format had: keys uncompressed, LSH
    ordinals and order words, signatures as bytes (format 3) or uint32 (format 2, whose fold16 is the stored one),
    and no fence (format 2)."""
    stem = task.chunk.stem
    keys, sigs, lsh = (task.segment / step / stem for step in ("keys", "signatures", "lsh"))
    with BlockReader(f"{keys}.key.zst") as f:
        Path(f"{keys}.key.bin").write_bytes(f.read(0, int(np.load(f"{keys}.key_offsets.npy")[-1])))
    folded = np.load(f"{sigs}.npy")
    np.save(f"{sigs}.npy", folded.astype(np.uint32) if version == 2 else mh.fold8(folded))
    item = np.load(f"{lsh}.item.npy").astype(np.int64)
    np.save(
        f"{lsh}.doc.npy", np.load(f"{sigs}.items.npz")["item_doc"][item].astype(np.int64 if version == 2 else np.int32)
    )
    words = [mh.order_words(folded, (b + 1) * task.rows, ORDER_ROWS)[item[b]] for b in range(len(item))]
    np.save(f"{lsh}.order.npy", np.stack(words) if words else np.empty((0, 0, 2), dtype=np.uint64))
    for path in (f"{keys}.key.zst", f"{keys}.key.zst.blocks.npy", f"{lsh}.item.npy") + (
        (f"{lsh}.fence.npy",) if version == 2 else ()
    ):
        Path(path).unlink()


def _template_batches(seed: int) -> list[list[dict]]:
    """Two batches of 30 poems that share a 34-character opening (about 0.7 similar: all kept, while their LSH bands
    collide in buckets of many members)."""
    rng = random.Random(seed)
    head = random_poem(rng, 40)[:34]
    return [[dedup_record(f"b{b}.json", i, head + random_poem(rng, 40)[:6]) for i in range(30)] for b in range(2)]


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("case", ["planted", "oversized"])
def test_segments_of_earlier_formats_are_read_as_they_are(tmp_path, monkeypatch, version, case):
    """Segments written by earlier code (format 3: keys uncompressed, LSH ordinals and order words, signatures as
    bytes; format 2 also uint32 signatures, int64 ordinals and no fence) give the later batches the same candidates
    and decisions as format 4's, whose smaller files hold the same facts: in oversized buckets too, whose members
    are paired in the order of the words format 4 derives from its signatures."""
    if case == "planted":
        batches, settings = _batches(seed=5)[0], DedupSettings(keep="first_seen", chunk_bytes=2000)
    else:
        batches = _template_batches(seed=3)
        settings = DedupSettings(keep="first_seen", chunk_bytes=2000, max_bucket=2, bucket_neighbours=1)
    _run_batches(tmp_path / "new", batches, settings, workers=1)

    def earlier_format(task: index.SegmentTask) -> index.SegmentChunk:
        written = index.write_segment_chunk(task)
        _rewrite_as_format(version, task)
        return written

    with monkeypatch.context() as m:
        m.setattr(index, "INDEX_FORMAT", version)
        m.setattr(cluster_parts, "write_segment_chunk", earlier_format)
        _run_batches(tmp_path / "old", batches, settings, workers=1)
    folders = lambda root: sorted((root / "deduped").iterdir())  # noqa: E731
    assert _decisions(folders(tmp_path / "old")) == _decisions(folders(tmp_path / "new"))
    for later in [f"g1-b{b + 1:04d}" for b in range(1, len(batches))]:  # the same figures, but the index's size
        old, new = (read_json(tmp_path / run / "report" / later / REPORT_FILE) for run in ("old", "new"))
        assert old["incremental"]["counts"].pop("index_bytes_added") > new["incremental"]["counts"].pop(
            "index_bytes_added"
        )
        assert old == new
        assert (new["counts"]["oversized_buckets"] > 0) == (case == "oversized")
    old_sig = {2: "uint32", 3: "uint8"}[version]
    for root, expected in (
        (tmp_path / "old", (version, old_sig, ".doc.npy")),
        (tmp_path / "new", (4, "uint16", ".item.npy")),
    ):
        for segment in sorted((root / "index").iterdir()):
            assert read_json(segment / SEGMENT_FILE)["format_version"] == expected[0]
            assert {np.load(f).dtype.name for f in (segment / "signatures").glob("*[0-9].npy")} == {expected[1]}
            assert {f.name[len(f.name.split(".")[0]) :] for f in (segment / "lsh").iterdir()} >= {
                ".hash.npy",
                expected[2],
            }
    new_segment = sorted((tmp_path / "new" / "index").iterdir())[0]
    assert not list(new_segment.rglob("*.order.npy")) and not list(new_segment.rglob("*.key.bin"))


def test_block_compressed_keys_read_any_range_and_a_damaged_frame_is_named(tmp_path):
    """An index segment's keys (io.write_zstd_blocks): any byte range, across frame edges too, reads back as written;
    a frame overwritten on disk is an error naming the file and the frame."""
    rng = random.Random(4)
    data = "".join(random_poem(rng, 40) for _ in range(3000)).encode()  # ~360 KB: several frames
    path = tmp_path / "k.key.zst"
    write_zstd_blocks(path, data)
    with BlockReader(path) as f:
        for start in [0, ZSTD_BLOCK - 3, 2 * ZSTD_BLOCK, *rng.sample(range(len(data)), 50)]:
            end = min(len(data), start + rng.choice([0, 1, 40, ZSTD_BLOCK + 7]))
            assert f.read(start, end) == data[start:end]
    frames = np.load(f"{path}.blocks.npy")
    with open(path, "r+b") as f:
        f.seek(int(frames[1]))
        f.write(b"\0" * 16)
    with BlockReader(path) as f, pytest.raises(CorruptOutputError, match=r"k\.key\.zst: frame 1 "):
        f.read(ZSTD_BLOCK, ZSTD_BLOCK + 5)


def test_an_earlier_batch_record_is_never_removed(tmp_path):
    """richest_meta: a one-shot build keeps the later, richer copy; batch by batch the indexed record stays and
    the later copy is removed as its duplicate."""
    rng = random.Random(5)
    t, u = random_poem(rng, 40), random_poem(rng, 40)
    first = [dedup_record("a.json", 0, t, {}), dedup_record("a.json", 1, u, {})]
    later = [
        dedup_record("b.json", 0, t + "。", {"title": "x", "author": "y"}),
        dedup_record("b.json", 1, substitute(u, 9), {"title": "x"}),
    ]
    _run_batches(tmp_path, [first, later], DedupSettings(), workers=1)
    kept, removed = _decisions([tmp_path / "deduped" / "g1-b0001", tmp_path / "deduped" / "g1-b0002"])
    assert kept == {first[0]["id"], first[1]["id"]}
    assert {i: r[:2] for i, r in removed.items()} == {
        later[0]["id"]: (first[0]["id"], "exact"),
        later[1]["id"]: (first[1]["id"], "near"),
    }
    write_records(tmp_path / "all", first + later)
    build_dedup_report(tmp_path / "all", tmp_path / "rep", DedupSettings(), workers=1)
    write_deduped(tmp_path / "all", tmp_path / "rep", tmp_path / "out", workers=1)
    assert later[0]["id"] in _decisions([tmp_path / "out"])[0]  # what the incremental rule documents as differing


@pytest.mark.parametrize("clusters", ["star", "components"])
def test_the_second_look_never_removes_an_earlier_batch_record(tmp_path, clusters):
    """Batch 1 (first_seen, one neighbour per oversized bucket) keeps near copies of one poem never compared; batch
    2's copies join them into one component, whose second look (richest_meta), or its whole removal (components),
    must leave every indexed record."""
    rng = random.Random(7)
    base = random_poem(rng, 90)

    def copy() -> str:
        text = base
        for pos in rng.sample(range(90), 2):
            text = substitute(text, pos, rng.choice("甲乙丙丁戊己庚辛"))
        return text

    sparse = {"max_bucket": 4, "bucket_neighbours": 1, "bucket_hubs": 0}  # copies left apart by the first walk
    first = [dedup_record("a.json", i, copy()) for i in range(120)]
    _run_batches(tmp_path, [first], DedupSettings(keep="first_seen", **sparse), workers=1)
    kept_first, _ = _decisions([tmp_path / "deduped" / "g1-b0001"])
    assert len(kept_first) >= 2
    later = write_records(tmp_path / "cleaned" / "g1-b0002", [dedup_record("b.json", i, copy()) for i in range(60)])
    report, out = tmp_path / "report" / "g1-b0002", tmp_path / "deduped" / "g1-b0002"
    dedup_batch(
        later,
        [tmp_path / "index" / "g1-b0001"],
        report,
        tmp_path / "index" / "g1-b0002",
        DedupSettings(clusters=clusters, **sparse),
        workers=1,
    )
    write_deduped(later, report, out, workers=1)
    clusters = [json.loads(line) for line in (report / CLUSTERS_FILE).read_text().splitlines()]
    indexed_removed = [m for c in clusters for m in c["members"] if m["role"] == "removed" and m["id"] in kept_first]
    assert indexed_removed == [] and len(_decisions([out])[1]) > 30


def test_identical_outputs_for_any_worker_count_and_partition(tmp_path):
    batches, _ = _batches(seed=2)
    settings = DedupSettings(keep="first_seen", chunk_bytes=600)  # many chunks: every step has several tasks
    tiny = Partitions(exact_docs=16, bucket_items=64, verify_pairs=8, cluster_docs=3)
    runs = []
    for name, kw in (("w1", {"workers": 1}), ("w2", {"workers": 2, "partitions": tiny})):
        _run_batches(tmp_path / name, batches, settings, **kw)
        files = {}
        for asset in ("report", "index", "deduped"):
            for p in sorted((tmp_path / name / asset).rglob("*")):
                if p.is_file() and p.name != "_timings.json":
                    files[str(p.relative_to(tmp_path / name))] = p.read_bytes()
        runs.append(files)
    assert runs[0].keys() == runs[1].keys() and any("segment.json" in k for k in runs[0])
    differ = [k for k in runs[0] if runs[0][k] != runs[1][k] and not k.endswith(REPORT_FILE)]
    assert differ == []
    for k in (k for k in runs[0] if k.endswith(REPORT_FILE)):  # the partition counts differ, nothing else
        a, b = (json.loads(r[k]) for r in runs)
        a.pop("partitions"), b.pop("partitions")
        assert a == b


def test_empty_batch_and_index_errors(tmp_path):
    batches, _ = _batches(seed=3)
    (tmp_path / "cleaned" / "g1-b0002").mkdir(parents=True)
    (tmp_path / "cleaned" / "g1-b0002" / "part-00000.jsonl").write_text("")
    settings = DedupSettings(keep="first_seen")
    stats = [_run_batches(tmp_path, batches[:1], settings, workers=1)[0][0]]
    segments = [tmp_path / "index" / "g1-b0001"]
    for key in ("g1-b0002", "g1-b0003"):  # an empty shard, then no shard at all
        (tmp_path / "cleaned" / key).mkdir(parents=True, exist_ok=True)
        stats.append(
            dedup_batch(
                tmp_path / "cleaned" / key,
                segments,
                tmp_path / "report" / key,
                tmp_path / "index" / key,
                settings,
                workers=1,
            )
        )
        applied = write_deduped(tmp_path / "cleaned" / key, tmp_path / "report" / key, tmp_path / "deduped" / key)
        assert stats[-1].docs_in == stats[-1].docs_out == applied.docs_out == 0
        assert stats[-1].incremental["index_records_added"] == 0 and (tmp_path / "index" / key / SEGMENT_FILE).exists()
        segments.append(tmp_path / "index" / key)
    # the batch after the empty ones still sees batch 1
    later = write_records(tmp_path / "cleaned" / "g1-b0004", batches[0][:3])
    s = dedup_batch(later, segments, tmp_path / "report" / "x", tmp_path / "index" / "g1-b0004", settings, workers=1)
    assert s.docs_out == 0 and s.incremental["dropped_exact_cross_batch"] == 3
    assert not list((tmp_path / "index").glob(".*"))  # no staging folder left behind

    with pytest.raises(ConfigError, match=r"g1-b0001.*num_perm"):
        dedup_batch(later, segments, tmp_path / "r2", tmp_path / "i2", DedupSettings(keep="first_seen", num_perm=64))
    with pytest.raises(ConfigError, match=r"g1-b0001.*shingles"):  # another shingle scheme: other signatures
        dedup_batch(
            later, segments, tmp_path / "r2", tmp_path / "i2", DedupSettings(keep="first_seen", shingles="chars")
        )
    with pytest.raises(ConfigError, match=r"g1-b0001.*bands"):  # a shape set other than the index's
        dedup_batch(
            later, segments, tmp_path / "r2", tmp_path / "i2", DedupSettings(keep="first_seen", bands=8, rows=8)
        )
    (tmp_path / "index" / "g1-b0002" / SEGMENT_FILE).unlink()
    with pytest.raises(StaleUpstreamError, match="g1-b0002"):
        dedup_batch(later, segments, tmp_path / "r3", tmp_path / "i3", settings, workers=1)
    assert not (tmp_path / "i3").exists()


def test_an_automatic_band_shape_follows_the_index_built_under_another(tmp_path):
    """A data root indexed under an earlier default shape (16 x 8) takes its next batch with the automatic one."""
    batches, _ = _batches(seed=5)
    _run_batches(tmp_path, batches[:1], DedupSettings(keep="first_seen", bands=16, rows=8), workers=1)
    assert DedupSettings().band_shape() != (16, 8)
    later = write_records(tmp_path / "cleaned" / "g1-b0002", batches[1])
    stats = dedup_batch(
        later,
        [tmp_path / "index" / "g1-b0001"],
        tmp_path / "report" / "g1-b0002",
        tmp_path / "index" / "g1-b0002",
        DedupSettings(keep="first_seen"),
        workers=1,
    )
    assert stats.docs_in == len(batches[1])
    built = json.loads((tmp_path / "index" / "g1-b0002" / SEGMENT_FILE).read_text())["settings"]
    assert (built["bands"], built["rows"]) == (16, 8)
