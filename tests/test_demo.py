"""The demo corpus generator: deterministic, and its manifest tells the truth about what it planted."""

import gzip
import re
import zlib
from pathlib import Path

import ftfy
import pytest

from devtools.demo import DEFAULT_SEED, generate_demo_corpus
from tokenmill.common.io import iter_jsonl, record_shards
from tokenmill.stages.raw import RawSettings, ingest


def files_of(folder: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            data = p.read_bytes()
            # compressed bytes depend on the zlib build; the content must match exactly
            out[p.relative_to(folder).as_posix()] = gzip.decompress(data) if p.suffix == ".gz" else data
    return out


@pytest.fixture(scope="module")
def demo_records(demo_source, tmp_path_factory) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("demo-raw")
    ingest(demo_source, out, RawSettings())
    return {r["id"]: r for shard in record_shards(out) for r in iter_jsonl(shard)}


def norm(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.lower())


def test_regenerating_gives_the_committed_files(demo_source, demo_manifest, tmp_path):
    manifest = generate_demo_corpus(tmp_path, seed=DEFAULT_SEED)
    assert manifest == demo_manifest
    assert (tmp_path / "manifest.json").read_bytes() == (demo_source.parent / "manifest.json").read_bytes()
    assert files_of(tmp_path / "source") == files_of(demo_source)
    other = generate_demo_corpus(tmp_path / "other", seed=DEFAULT_SEED + 1)
    assert other["exact_duplicates"] != manifest["exact_duplicates"]


def test_corpus_shape(demo_source, demo_manifest):
    size = sum(p.stat().st_size for p in demo_source.rglob("*") if p.is_file())
    assert 0.8e6 < size < 3e6
    assert 2000 < demo_manifest["records"] < 5000
    formats = {f["format"] for f in demo_manifest["files"].values()}
    assert formats == {"jsonl", "json", "txt", "csv", "jsonl.gz", "warc.gz"}  # warc.gz: the real web pages
    kinds = demo_manifest["record_kinds"]
    assert min(kinds[k] for k in ("en_prose", "en_verse", "zh_poem", "zh_prose", "post")) > 300
    reasons = {r["reason"] for r in demo_manifest["rejected_raw"]}
    assert {"malformed_json", "no_text_field", "not_an_object", "undecodable_bytes"} <= reasons


def test_duplicates_are_what_the_manifest_says(demo_manifest, demo_records):
    variants = {v["variant"] for v in demo_manifest["exact_duplicate_variants"]}
    assert variants == {"identical", "whitespace", "punctuation", "case"}
    for a, b in demo_manifest["exact_duplicates"]:
        assert norm(demo_records[a]["text"]) == norm(demo_records[b]["text"]), (a, b)
    assert len(demo_manifest["exact_duplicates"]) >= 40
    edits = {"substitution": 0, "reorder": 0}
    for p in demo_manifest["near_duplicates"]:
        ta, tb = demo_records[p["a"]]["text"], demo_records[p["b"]]["text"]
        assert norm(ta) != norm(tb)
        if p["edit"] == "substitution":
            assert len(ta) == len(tb) and 1 <= sum(x != y for x, y in zip(ta, tb)) <= 3
        else:
            assert sorted(ta.split("\n")) == sorted(tb.split("\n"))
        edits[p["edit"]] += 1
    assert edits["substitution"] >= 20 and edits["reorder"] >= 10


def test_no_unplanted_near_duplicates(demo_manifest, demo_records):
    """Negatives are real: apart from the planted pairs, no two records share >= 50% of their shingles."""
    datasketch = pytest.importorskip("datasketch")
    skip = {g["id"] for g in demo_manifest["garbled"]}
    boiler = set(demo_manifest["boilerplate_lines"])
    planted = {frozenset(p) for p in demo_manifest["exact_duplicates"]}
    planted |= {frozenset((p["a"], p["b"])) for p in demo_manifest["near_duplicates"]}
    lsh = datasketch.MinHashLSH(threshold=0.5, num_perm=64)
    sets, sigs = {}, {}
    for rid, rec in demo_records.items():
        if rid in skip:
            continue
        t = norm("\n".join(ln for ln in rec["text"].split("\n") if ln.strip() not in boiler))
        sets[rid] = {t[i : i + 5] for i in range(max(1, len(t) - 4))}
        mh = datasketch.MinHash(num_perm=64, seed=1)
        mh.update_batch([s.encode() for s in sets[rid]])
        lsh.insert(rid, mh)
        sigs[rid] = mh
    unplanted = []
    for rid, mh in sigs.items():
        for other in lsh.query(mh):
            pair = frozenset((rid, other))
            if other != rid and pair not in planted:
                a, b = sets[rid], sets[other]
                if len(a & b) / len(a | b) >= 0.6:
                    unplanted.append(pair)
    assert not unplanted


def test_planted_defects(demo_manifest, demo_records):
    texts = {rid: r["text"] for rid, r in demo_records.items()}
    # mojibake: ftfy restores the original exactly
    assert len(demo_manifest["mojibake"]) >= 10
    for m in demo_manifest["mojibake"]:
        assert texts[m["id"]] != m["original"] and ftfy.fix_encoding(texts[m["id"]]) == m["original"]
    # garbled records look like their reason
    reasons = {}
    for g in demo_manifest["garbled"]:
        t = texts[g["id"]]
        reasons[g["reason"]] = reasons.get(g["reason"], 0) + 1
        if g["reason"] == "empty":
            assert not t.strip()
        elif g["reason"] == "too_short":
            assert 0 < len(t.strip()) <= 8
        elif g["reason"] == "placeholder_glyphs":
            assert sum(c in "\ufffd□" for c in t) / len(t) > 0.3
        elif g["reason"] == "repetition":
            assert len(zlib.compress(t.encode())) < 0.2 * len(t.encode())
        else:
            pytest.fail(g["reason"])
    assert set(reasons) == {"empty", "too_short", "placeholder_glyphs", "repetition"}
    # genuine records are never that short
    garbled = {g["id"] for g in demo_manifest["garbled"]}
    assert min(len(t) for rid, t in texts.items() if rid not in garbled) >= 20
    # header metadata lines at the top of the text
    assert len(demo_manifest["header_metadata"]) >= 20
    for h in demo_manifest["header_metadata"]:
        first, second = texts[h["id"]].split("\n")[:2]
        assert (first, second) in (
            (f"Title: {h['title']}", f"Author: {h['author']}"),
            (f"标题：{h['title']}", f"作者：{h['author']}"),
        )


def test_boilerplate_at_edges_and_genuine_lines_anywhere(demo_manifest, demo_records):
    positions = {}
    for rec in demo_records.values():
        lines = rec["text"].split("\n")
        for i, ln in enumerate(lines):
            where = "first" if i == 0 else "last" if i == len(lines) - 1 else "middle"
            positions.setdefault(ln, []).append(where)
    for line in demo_manifest["boilerplate_lines"]:
        assert len(positions[line]) >= 25 and "middle" not in positions[line], line
    for line in demo_manifest["genuine_frequent_lines"]:
        assert len(positions[line]) >= 25 and positions[line].count("middle") >= 10, line
    for d in demo_manifest["boilerplate_docs"]:
        lines = demo_records[d["id"]]["text"].split("\n")
        assert d["lines"][0] in (lines[0], lines[-1])
    texts = "\n".join(r["text"] for r in demo_records.values())
    for word in demo_manifest["genuine_frequent_words"]:
        assert texts.count(word) >= 50
