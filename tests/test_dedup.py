"""dedup_report / deduped_jsonl: key normalization, datasketch-identical signatures, bands, verification,
union-find, keep rule, conservation, determinism and the two assets end to end."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from support import BATCH, materialize_batch

from tokenmill.common.io import REMOVED_FILE, STATS_FILE, iter_jsonl, record_id, record_shards
from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill.settings import load_settings
from tokenmill.stages.dedup import (
    CLUSTERS_FILE,
    DECISION_DIR,
    REPORT_FILE,
    DedupSettings,
    Partitions,
    build_dedup_report,
    write_deduped,
)
from tokenmill.stages.dedup import keys as K
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.layout import NpyRows

CHARS = "春江潮水连海平明月共生滟随波千万里何处无光流宛转绕芳甸照花林皆似霰空中霜飞不觉汀上白沙看见"


def _rec(path: str, index: int, text: str, meta: dict | None = None) -> dict:
    return {
        "id": record_id(path, index=index),
        "text": text,
        "meta": meta or {},
        "source": {"path": path, "index": index},
    }


def _poem(rng: random.Random, n: int = 28) -> str:
    return "".join(rng.choice(CHARS) for _ in range(n))


def _write(folder: Path, records: list[dict], per_shard: int = 10**9) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(0, max(len(records), 1), per_shard):
        with open(folder / f"part-{s // per_shard:05d}.jsonl", "w", encoding="utf-8") as f:
            for r in records[s : s + per_shard]:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return folder


def _substitute(text: str, pos: int, ch: str = "龍") -> str:
    return text[:pos] + ch + text[pos + 1 :]


def _corpus(seed: int = 0) -> tuple[list[dict], dict]:
    """200 distinct poems in a.json; b.json: 30 exact copies (punctuated), 20 one-substitution variants."""
    rng = random.Random(seed)
    base = [_poem(rng, 40) for _ in range(200)]  # one substitution: Jaccard ~0.9, caught with p > 0.9998
    recs = [_rec("a.json", i, t, {"title": f"t{i}"}) for i, t in enumerate(base)]
    truth = {"exact": set(), "near": set()}
    for i in range(30):
        t = base[i]
        r = _rec("b.json", i, f"{t[:14]}，{t[14:]}。", {"title": f"t{i}", "author": "someone"})
        recs.append(r)
        truth["exact"].add(r["id"])
    for i in range(30, 50):
        r = _rec("b.json", i, _substitute(base[i], 9))
        recs.append(r)
        truth["near"].add(r["id"])
    return recs, truth


# -------------------------------------------------------------------------------------------------
# Level 1: the key
# -------------------------------------------------------------------------------------------------


def test_dedup_key_normalization():
    k = K.dedup_key
    assert k("Ｈｅｌｌｏ，　ＷＯＲＬＤ！") == k("hello world") == "helloworld"  # NFKC full-width, casefold, spaces
    assert k("床前明月光，疑是地上霜。") == k("床前明月光\n疑是地上霜") == "床前明月光疑是地上霜"
    assert k("a\u200bb\ufeffc") == "abc"  # zero-width space and BOM (format characters)
    assert k("Straße") == k("STRASSE")  # full case folding
    assert k("★ love ♥ ©2024") == "love2024" and k("★ love", strip_symbols=False) == "★love"
    assert k("春眠不觉晓") != k("春眠不覺曉")  # no Chinese folding unless asked
    assert k("!!!") != k("???") and k("!!!") == "!!!"  # all-punctuation texts key on themselves
    assert K.key_digest(k("a b")) == K.key_digest(k("AB")) and len(K.key_digest("x")) == 32


def test_batch_keys_equal_per_text_keys():
    rng = random.Random(0)
    tricky = [
        "Ｈｅｌｌｏ，　ＷＯＲＬＤ！",
        "Straße ™ ① ﬁ",
        "e\u0301 cafe\u0301",
        "!!!",
        "",
        "  ",
        "\u1100\u1161",
        "가나",
        "İstanbul",
        "ΣΑΣ",
        "x\U00020000y",
        "😀 hi",
        "a\u200bb",
        "床前明月光，疑是地上霜。",
    ]
    pools = [
        (0x20, 0x2FF),
        (0x300, 0x36F),
        (0x1100, 0x11FF),
        (0x2000, 0x33FF),
        (0xAC00, 0xAC20),
        (0xFF00, 0xFFEF),
        (0x4E00, 0x4E40),
        (0x1F300, 0x1F320),
    ]
    texts = tricky + [
        "".join(chr(rng.randint(*rng.choice(pools))) for _ in range(rng.randint(0, 12))) for _ in range(3000)
    ]
    for strip in (True, False):
        assert K.dedup_keys(texts, strip) == [K.dedup_key(t, strip) for t in texts]
        spaced = K.dedup_keys(texts, strip, spaced=True)
        assert spaced == [K.dedup_key(t, strip, spaced=True) for t in texts]
        assert [K.exact_key(k) for k in spaced] == K.dedup_keys(texts, strip)  # the same exact identity


def test_spaced_keys_and_shingle_unit_by_script():
    assert K.dedup_key("  AEdiles,  seize\n him! ", spaced=True) == "aediles seize him"
    keys = ["aediles seize him", "床前 明月光", "привет мир", "ไทย ภาษา", "", "abc 春"]
    assert K.by_words(keys).tolist() == [True, False, True, False, False, True]


def test_chinese_folding_is_optional_and_consistent():
    pytest.importorskip("opencc")
    texts = ["舉頭望明月，低頭思故鄉。", "举头望明月\n低头思故乡", "Hello, 世界!"]
    keys = K.dedup_keys(texts, fold_chinese=True)
    assert keys[0] == keys[1] == "举头望明月低头思故乡" and keys[2] == "hello世界"
    assert keys == [K.dedup_key(t, fold_chinese=True) for t in texts]
    assert K.dedup_keys(texts[:2]) == ["舉頭望明月低頭思故鄉", "举头望明月低头思故乡"]  # off by default


def test_exact_level_groups_normalized_variants(tmp_path):
    recs = [
        _rec("f.json", 0, "Hello, World!"),
        _rec("f.json", 1, "hello world"),
        _rec("f.json", 2, "ＨＥＬＬＯ　ＷＯＲＬＤ。"),
        _rec("f.json", 3, "goodbye world"),
    ]
    _write(tmp_path / "in", recs)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    assert stats["dropped_exact_duplicate"] == 2 and stats["dropped_near_duplicate"] == 0
    assert stats["docs_out"] == 2


# -------------------------------------------------------------------------------------------------
# Level 2: hashes and signatures, identical to datasketch
# -------------------------------------------------------------------------------------------------

KEYS = [
    "床前明月光疑是地上霜举头望明月低头思故乡",
    "helloworld",
    "a",
    "",
    "ab",
    "abc",
    "🦊fox🦊" * 5,
    "".join(chr(0x20000 + i) for i in range(12)),
]  # astral-plane CJK extension B


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_vectorized_shingle_hashes_equal_python(n):
    hashes, offsets = mh.shingle_hashes(KEYS, n)
    for i, key in enumerate(KEYS):
        ref = [mh.shingle_hash32(s) for s in mh.shingles(key, n)]
        assert hashes[offsets[i] : offsets[i + 1]].tolist() == ref
        assert [mh.shingle_hash32(s.encode("utf-8")) for s in mh.shingles(key, n)] == ref


WORD_KEYS = ["aediles seize him", "", "one", "a b", "春江 潮水 连海平", "🦊 fox " * 7 + "end", "x y z w v u"]


@pytest.mark.parametrize("hash_name", ["poly", "sha1"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_word_shingle_hashes_equal_python_and_datasketch(n, hash_name):
    from datasketch import MinHash

    assert mh.word_shingles("a b c", 2) == ["a b", "b c"] and mh.word_shingles("a b", 3) == ["a b"]
    hashes, offsets = mh.word_shingle_hashes(WORD_KEYS, n, hash_name)
    sig = mh.signatures(hashes, offsets, num_perm=32, seed=3)
    for i, key in enumerate(WORD_KEYS):
        ref = [mh.HASHFUNCS[hash_name](s) for s in mh.word_shingles(key, n)]
        assert hashes[offsets[i] : offsets[i + 1]].tolist() == ref
        m = MinHash(num_perm=32, seed=3, hashfunc=mh.HASHFUNCS[hash_name])
        m.update_batch(mh.word_shingles(key, n))
        assert np.array_equal(m.hashvalues, sig[i])


@pytest.mark.parametrize("hash_name", ["poly", "sha1"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_signatures_identical_to_datasketch(hash_name, n):
    from datasketch import MinHash

    rng = random.Random(n)
    keys = KEYS + [_poem(rng, rng.randint(1, 300)) for _ in range(30)]
    hashes, offsets = mh.shingle_hashes(keys, n, hash_name)
    sig = mh.signatures(hashes, offsets, num_perm=64, seed=7, chunk=256)  # small chunks: many boundaries
    for i, key in enumerate(keys):
        if hash_name == "poly":
            m = MinHash(num_perm=64, seed=7, hashfunc=mh.shingle_hash32)
            m.update_batch(mh.shingles(key, n))
        else:  # stock datasketch: default sha1_hash32 on UTF-8 bytes
            m = MinHash(num_perm=64, seed=7)
            m.update_batch([s.encode("utf-8") for s in mh.shingles(key, n)])
        assert np.array_equal(m.hashvalues, sig[i]), (key, n)
    a, b = mh.permutations(64, 7)
    ref = MinHash(num_perm=64, seed=7).permutations
    assert np.array_equal(a, ref[0]) and np.array_equal(b, ref[1])


def test_signatures_usable_in_datasketch_lsh():
    from datasketch import MinHash, MinHashLSH

    keys = [
        "床前明月光疑是地上霜举头望明月低头思故乡",
        "床前明月光疑是地上霜举头望山月低头思故乡",
        "白日依山尽黄河入海流",
    ]
    hashes, offsets = mh.shingle_hashes(keys, 2)
    sig = mh.signatures(hashes, offsets)
    lsh = MinHashLSH(threshold=0.6, num_perm=128)
    ms = [MinHash(num_perm=128, seed=1, hashfunc=mh.shingle_hash32, hashvalues=s, scheme="affine32") for s in sig]
    for i, m in enumerate(ms):
        lsh.insert(i, m)
    assert sorted(lsh.query(ms[0])) == [0, 1]


def _codes(s: DedupSettings, units: int, by_word: bool = False) -> list[int]:
    doc, code = s.items(np.array([units]), np.array([by_word]))
    return code.tolist()


def test_ngram_rule_and_length_boundary():
    s = DedupSettings()
    assert [mh.ngram_size(L, 0, (100, 1000)) for L in (28, 99, 100, 999, 1000)] == [2, 2, 3, 3, 5]
    assert _codes(s, 28) == [2] and _codes(s, 200) == [3]
    assert _codes(s, 95) == [2, 3] and _codes(s, 105) == [2, 3]  # near the bound: both sizes
    assert _codes(DedupSettings(ngram=4), 5000) == [4]
    word = mh.shingle_code
    assert _codes(s, 6, True) == [word(3, True)] and _codes(s, 100, True) == [word(2, True)]  # short: 3 words
    assert _codes(s, 19, True) == _codes(s, 21, True) == [word(2, True), word(3, True)]  # near the bound: both
    assert _codes(DedupSettings(ngram=4), 50, True) == [word(4, True)]
    lengths = np.arange(0, 2500)
    for by_word in (False, True):
        doc, code = s.items(lengths, np.full(len(lengths), by_word))
        assert list(zip(doc.tolist(), code.tolist())) == [
            (L, c) for L in lengths.tolist() if L for c in _codes(s, L, by_word)
        ]
    units, by_word = np.array([[5, 30], [300, 10], [40, 40]]), np.array([[True, True], [False, False], [True, False]])
    assert s.pair_codes(units, by_word).tolist() == [word(2, True), 3, 0]  # the longer member's; units differ: none


def test_near_duplicates_across_the_length_bound_are_found(tmp_path):
    rng = random.Random(3)
    a = _poem(rng, 98)
    b = a + _poem(rng, 4)  # 102 chars: 3-grams on its own, 2-grams for the 98-char original
    _write(tmp_path / "in", [_rec("x.json", 0, a), _rec("x.json", 1, b)])
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    assert stats["dropped_near_duplicate"] == 1


def test_reordered_short_latin_lines_are_not_near_duplicates(tmp_path):
    """Word shingles for space-separated scripts: a reordered short line is another line (character 2-grams of
    its key called it a near duplicate at Jaccard 0.90); a word changed in a longer text still is one."""
    rng = random.Random(5)
    words = [f"{w}{rng.randint(0, 9)}" for w in ("alpha", "beta", "gamma", "delta") * 12]
    long_text = " ".join(words)
    recs = [
        _rec("s.txt", 0, "BRUTUS:\nAEdiles, seize him!"),
        _rec("s.txt", 1, "BRUTUS:\nSeize him, AEdiles!"),
        _rec("s.txt", 2, long_text),
        _rec("s.txt", 3, long_text.replace(words[20], "zeta", 1)),
    ]
    _write(tmp_path / "in", recs)
    for shingles, near in (("by_script", 1), ("chars", 2)):
        rep = tmp_path / f"rep-{shingles}"
        stats = build_dedup_report(tmp_path / "in", rep, DedupSettings(shingles=shingles), workers=1)
        assert stats["dropped_near_duplicate"] == near
    report = json.loads((tmp_path / "rep-by_script" / REPORT_FILE).read_text())
    assert report["parameters"]["shingle_sizes"] == {"2 words": 2, "3 words": 2}


def test_tinyshakespeare_short_lines_are_not_near_duplicates(tmp_path, shared_dir):
    """Measured on tinyshakespeare's speeches (7158 records after cleaning): character shingles removed 25 distinct
    short speeches as near duplicates ("AEdiles, seize him!" / "Seize him, AEdiles!"), word shingles none."""
    from tokenmill.stages.clean import clean_corpus
    from tokenmill.stages.raw import ingest

    source = shared_dir / "corpora" / "tinyshakespeare"
    if not source.exists():
        pytest.skip("tinyshakespeare not present")
    ingest(source, tmp_path / "raw", workers=1)
    clean_corpus(tmp_path / "raw", tmp_path / "clean", workers=1)
    stats = build_dedup_report(tmp_path / "clean", tmp_path / "rep", DedupSettings(), workers=1)
    assert stats["docs_in"] > 7000 and stats["dropped_near_duplicate"] == 0


# -------------------------------------------------------------------------------------------------
# Bands, buckets, verification
# -------------------------------------------------------------------------------------------------


def test_band_choice_favours_recall():
    from datasketch import MinHashLSH

    assert mh.choose_bands(0.8, 128) == (16, 8)
    b, r = mh.choose_bands(0.85, 128)
    assert (b, r) == (14, 9) and mh.catch_probability(0.85, b, r) > 0.97
    ds = MinHashLSH(threshold=0.85, num_perm=128)
    assert mh.catch_probability(0.85, ds.b, ds.r) < 0.6  # datasketch's default misses many pairs at 0.85
    assert abs(mh.catch_probability(0.8, 16, 8) - (1 - (1 - 0.8**8) ** 16)) < 1e-12
    assert DedupSettings(bands=20, rows=6).band_shape() == (20, 6)
    with pytest.raises(ValueError):
        DedupSettings(bands=20, rows=7)


def test_bucket_pairs_and_oversized_buckets():
    h = np.array([5, 1, 5, 2, 5, 1, 9], dtype=np.uint64)
    members = np.arange(10, 17)
    pairs, st = mh.bucket_pairs(h, members, max_bucket=10)
    assert sorted(map(tuple, mh.unique_pairs(pairs).tolist())) == [(10, 12), (10, 14), (11, 15), (12, 14)]
    big = np.zeros(50, dtype=np.uint64)
    # an oversized bucket: each member with its next 4 in signature order (4m - 10 pairs, not m^2 / 2)
    order = (np.arange(50, dtype=np.uint64) % 5).reshape(50, 1) << np.uint64(48)
    pairs, st = mh.bucket_pairs(big, np.arange(50), max_bucket=10, neighbours=4, order=order)
    emitted = mh.pairs_per_bucket(np.array([50]), 10, 4)[0]
    assert emitted == 4 * 50 - 10 and st["oversized_buckets"] == 1 and st["pairs_not_emitted"] == 50 * 49 // 2 - emitted
    pairs = set(map(tuple, mh.unique_pairs(pairs).tolist()))
    assert len(pairs) == emitted and max(np.bincount(np.array(list(pairs)).ravel())) <= 2 * 4
    # members agreeing on the order rows sit together: 1, 6, 11, ... are neighbours, 1 and 2 are not
    assert {(1, 6), (1, 11), (1, 16), (1, 21), (1, 45)} <= pairs and (1, 2) not in pairs


def test_verification_rejects_planted_false_candidate(tmp_path):
    rng = random.Random(5)
    shared, x, y = _poem(rng, 20), _poem(rng, 20), _poem(rng, 20)
    # Jaccard about 0.3: 32 bands of 1 row make them LSH candidates almost surely, verification must reject
    recs = [_rec("v.json", 0, shared + x), _rec("v.json", 1, shared + y)]
    _write(tmp_path / "in", recs)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(bands=32, rows=1), workers=1)
    assert stats["candidate_pairs"] == 1 and stats["rejected_candidates"] == 1 and stats["verified_pairs"] == 0
    assert stats["docs_out"] == 2 and stats["records_removed"] == 0


def test_exact_jaccard_on_packed_shingle_sets():
    rng = random.Random(2)
    alphabet = "abc春江\U00020000\U0010fffd"
    for _ in range(500):
        n = rng.choice([1, 2, 3, 4, 5])
        a, b = ("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(2))
        ref = mh.jaccard(set(mh.shingles(a, n)), set(mh.shingles(b, n)))
        assert abs(mh.jaccard(mh.shingle_set(a, n), mh.shingle_set(b, n)) - ref) < 1e-12


def test_chains_do_not_remove_records_below_the_threshold(tmp_path):
    rng = random.Random(11)
    a = _poem(rng, 40)
    b = _substitute(a, 10)  # J(a, b) = 0.90 (2-grams)
    c = _substitute(_substitute(b, 25), 32)  # J(b, c) = 0.81, J(a, c) = 0.73 < 0.8
    _write(tmp_path / "in", [_rec("c.json", i, t) for i, t in enumerate((a, b, c))])
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(bands=32, rows=4), workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    ids = [record_id("c.json", index=i) for i in range(3)]
    assert stats["verified_pairs"] == 2 and stats["components"] == 1 and stats["components_with_several_kept"] == 1
    # union-find alone would remove c as a duplicate of a at 0.73; c is kept, b is removed as a's duplicate
    assert _kept_ids(tmp_path / "out") == {ids[0], ids[2]}
    (r,) = iter_jsonl(tmp_path / "out" / REMOVED_FILE)
    assert r["id"] == ids[1] and r["duplicate_of"] == ids[0] and r["similarity"] >= 0.8
    (cl,) = iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE)
    assert cl["kept"] == ids[0] and cl["component_size"] == 3 and len(cl["verified_pairs"]) == 1
    assert [p[:2] for p in cl["linked_pairs"]] == [[ids[1], ids[2]]]  # the cut link of the chain


def test_union_find():
    uf = mh.UnionFind(8)
    uf.union_pairs([(5, 6), (6, 7), (1, 2), (7, 3)])
    roots = uf.roots()
    assert roots.tolist() == [0, 1, 1, 3, 4, 3, 3, 3]  # root = smallest member
    assert uf.find(7) == 3 and not uf.union(5, 3) and uf.union(0, 4) and uf.find(4) == 0


# -------------------------------------------------------------------------------------------------
# Keep rule, conservation, determinism
# -------------------------------------------------------------------------------------------------


def _kept_ids(folder: Path) -> set:
    return {r["id"] for f in record_shards(folder) for r in iter_jsonl(f)}


@pytest.mark.parametrize("rule", ["richest_meta", "first", "longest"])
def test_keep_rule(tmp_path, rule):
    rng = random.Random(9)
    t = _poem(rng, 40)
    recs = [
        _rec("k/10.json", 0, t, {"title": "x"}),  # earliest, 1 meta field
        _rec("k/2.json", 0, t + "。", {"title": "x", "author": "y", "n": ""}),  # 2 non-empty meta fields
        _rec("k/2.json", 1, t + _poem(rng, 2), {}),  # near dup, longest text
        _rec("k/2.json", 2, t, {"title": "x", "author": "z"}),
    ]  # ties the richest, later
    _write(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(keep=rule), workers=1)
    write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    # natural path order: k/2.json comes before k/10.json
    expected = {"richest_meta": recs[1]["id"], "first": recs[0]["id"], "longest": recs[2]["id"]}[rule]
    assert _kept_ids(tmp_path / "out") == {expected}
    removed = list(iter_jsonl(tmp_path / "out" / REMOVED_FILE))
    assert {r["duplicate_of"] for r in removed} == {expected} and len(removed) == 3


@pytest.mark.parametrize("rule", ["richest_meta", "longest"])
def test_keep_rule_breaks_ties_by_quality(tmp_path, rule):
    """Equal meta and length: the capitalised copy beats an all-lowercase one listed first, a clean text one with
    replacement characters, and the reason is in clusters.jsonl and the report's samples."""
    text = "The Quiet Harbour\nWe walked along the old pier while the gulls circled over the grey water, " * 2
    essay = (
        "Rivers carry silt to the delta, where it settles into banks that shift with every flood season. Farmers "
        "follow the banks, planting rice on the new ground and moving their houses when the water comes back."
    )
    recs = [
        _rec("q/a.json", 0, text.lower(), {"title": "x"}),
        _rec("q/a.json", 1, text, {"title": "x"}),
        _rec("q/b.json", 0, essay.replace("settles", "settl\ufffd\ufffd"), {"title": "y"}),
        _rec("q/b.json", 1, essay, {"title": "y"}),
    ]
    _write(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(keep=rule), workers=1)
    clusters = {c["kept"]: c for c in iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE)}
    assert set(clusters) == {recs[1]["id"], recs[3]["id"]}
    assert clusters[recs[1]["id"]]["reason"] == "proper casing"
    assert clusters[recs[3]["id"]]["reason"] == "fewer replacement/garbage characters"
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    assert {x["kept"]: x["reason"] for x in report["samples"]} == {k: c["reason"] for k, c in clusters.items()}
    assert "proper casing" in report["parameters"]["keep_order"]


def test_counts_add_up_and_report(tmp_path):
    recs, truth = _corpus()
    _write(tmp_path / "in", recs, per_shard=90)
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(chunk_bytes=4096), workers=1)
    out = write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    removed = list(iter_jsonl(tmp_path / "out" / REMOVED_FILE))
    kept = _kept_ids(tmp_path / "out")
    assert out["docs_in"] == len(recs) == len(kept) + len(removed) == out["docs_out"] + len(removed)
    assert [p.name for p in record_shards(tmp_path / "out")] == [p.name for p in record_shards(tmp_path / "in")]
    by_level = {lv: {r["id"] for r in removed if r["level"] == lv} for lv in ("exact", "near")}
    # richest meta: the punctuated copies in b.json (2 fields) survive, their a.json originals go
    assert len(by_level["exact"]) == 30 and by_level["near"] == truth["near"]
    assert stats["dropped_exact_duplicate"] == 30 and stats["dropped_near_duplicate"] == 20
    for r in removed:
        assert set(r) >= {"id", "duplicate_of", "level", "similarity", "source", "reason"}
        assert (r["similarity"] == 1.0) == (r["level"] == "exact") and r["similarity"] >= 0.8
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    c = report["counts"]
    assert c["records_in"] == 250 and c["clusters"] == 50 and c["largest_cluster"] == 2
    assert c["cross_file_duplicates"] == 50 and c["candidate_pairs"] >= c["verified_pairs"] >= 20
    assert report["parameters"]["bands"] == 16 and report["parameters"]["catch_probability"]["0.8"] == 0.947
    src = {p["path"]: p for p in report["per_source"]}
    assert src["a.json"]["records_in"] == 200 and src["a.json"]["exact_removed"] == 30
    assert sum(p["kept"] for p in report["per_source"]) == len(kept)
    assert report["cluster_sizes"][0] == {"size": "2", "clusters": 50, "records": 100}
    assert report["samples"] and all(m["text"] for s in report["samples"] for m in s["members"])
    clusters = list(iter_jsonl(tmp_path / "rep" / CLUSTERS_FILE))
    assert len(clusters) == 50 and all(c["members"][0]["id"] == c["kept"] for c in clusters)
    assert len(list((tmp_path / "rep" / "signatures").glob("*.npy"))) >= 2 * 3  # per-chunk signatures + bands
    decided = [np.load(f)["id"] for f in sorted((tmp_path / "rep" / DECISION_DIR).glob("*.npz"))]
    assert sum(len(d) for d in decided) == len(removed)


def test_deterministic_for_any_worker_count_and_batch_size(tmp_path, monkeypatch):
    import tokenmill.stages.dedup.signatures as dedup

    recs, _ = _corpus(seed=1)
    _write(tmp_path / "in", recs, per_shard=60)
    outs = []
    for w, batch in ((1, dedup.SHINGLE_BATCH), (2, dedup.SHINGLE_BATCH), (1, 100)):
        monkeypatch.setattr(dedup, "SHINGLE_BATCH", batch)  # 100: a few documents per hashing batch
        rep, out = tmp_path / f"rep{w}-{batch}", tmp_path / f"out{w}-{batch}"
        build_dedup_report(tmp_path / "in", rep, DedupSettings(chunk_bytes=1500), workers=w)
        write_deduped(tmp_path / "in", rep, out, workers=w)
        report = (rep / REPORT_FILE).read_bytes()  # timings live in _timings.json: the report is byte-identical
        files = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
        sigs = {p.name: p.read_bytes() for p in sorted((rep / "signatures").iterdir())}
        outs.append((report, (rep / CLUSTERS_FILE).read_bytes(), files, sigs))
    assert outs[0] == outs[1] == outs[2]


def test_stale_report_is_refused(tmp_path):
    recs, _ = _corpus()
    _write(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    with open(tmp_path / "in" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(_rec("z.json", 0, "新的一首诗")) + "\n")
    with pytest.raises(StaleUpstreamError, match="rematerialize dedup_report"):
        write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)


def test_empty_input(tmp_path):
    (tmp_path / "in").mkdir()
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    out = write_deduped(tmp_path / "in", tmp_path / "rep", tmp_path / "out", workers=1)
    assert stats["docs_in"] == 0 and out["docs_out"] == 0 and (tmp_path / "out" / REMOVED_FILE).exists()


# -------------------------------------------------------------------------------------------------
# The assets
# -------------------------------------------------------------------------------------------------


def test_materialize_dedup_assets(tmp_path):
    from assets.dedup import dedup_batch_assets, deduped_jsonl

    recs, truth = _corpus()
    _write(tmp_path / "cleaned_jsonl" / BATCH, recs, per_shard=100)
    result = materialize_batch(
        [dedup_batch_assets, deduped_jsonl],
        tmp_path,
        tmp_path / "cleaned_jsonl",
        run_config={"ops": {"dedup_report": {"config": {"sample_clusters": 4}}}},
    )
    assert result.success
    md = result.asset_materializations_for_node("dedup_report")[0].metadata
    assert md["docs_in"].value == 250 and md["dropped_near_duplicate"].value == 20
    assert md["bands_x_rows"].value == "16 x 8"
    assert "removed" in md["sample_clusters"].value and "0.947" in md["parameters"].value
    assert len(md["per_source"].value.records) == 2
    assert (tmp_path / "dedup_index" / BATCH / "segment.json").exists()
    md2 = result.asset_materializations_for_node("deduped_jsonl")[0].metadata
    assert md2["docs_in"].value == md2["docs_out"].value + 50
    stats = json.loads((tmp_path / "deduped_jsonl" / BATCH / STATS_FILE).read_text())
    assert stats["docs_in"] == stats["docs_out"] + stats["dropped_exact_duplicate"] + stats["dropped_near_duplicate"]
    assert not any(
        p.name.endswith(".jsonl")
        and p.name not in ("part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl", REMOVED_FILE)
        for p in (tmp_path / "deduped_jsonl" / BATCH).iterdir()
    )
    assert (tmp_path / "deduped_jsonl" / REMOVED_FILE).read_bytes() == (
        tmp_path / "deduped_jsonl" / BATCH / REMOVED_FILE
    ).read_bytes()  # every batch's removed records, gathered


def test_demo_corpus_planted_duplicates_are_found(tmp_path, demo_source, demo_manifest):
    raw = pytest.importorskip("tokenmill.stages.raw")
    if not demo_source.exists():
        pytest.skip("demo corpus not generated")
    raw.ingest(demo_source, tmp_path / "raw", workers=1)
    build_dedup_report(tmp_path / "raw", tmp_path / "rep", DedupSettings(), workers=1)
    out = write_deduped(tmp_path / "raw", tmp_path / "rep", tmp_path / "out", workers=1)
    kept_of = {r["id"]: r["duplicate_of"] for r in iter_jsonl(tmp_path / "out" / REMOVED_FILE)}
    same = lambda a, b: kept_of.get(a, a) == kept_of.get(b, b)  # noqa: E731 - one survivor for both
    assert all(same(a, b) for a, b in demo_manifest["exact_duplicates"])
    assert all(same(p["a"], p["b"]) for p in demo_manifest["near_duplicates"])
    assert out["docs_in"] == demo_manifest["records"]


# -------------------------------------------------------------------------------------------------
# Partitioned steps, oversized buckets, settings, corrupt input
# -------------------------------------------------------------------------------------------------


def _decisions(rep: Path, out: Path) -> tuple:
    report = json.loads((rep / REPORT_FILE).read_text())
    counts = {k: v for k, v in report["counts"].items()}
    files = {p.name: p.read_bytes() for p in sorted(out.glob("*.jsonl"))}
    return counts, report["samples"], report["per_source"], (rep / CLUSTERS_FILE).read_bytes(), files


def test_partitioned_steps_decide_as_one_partition(tmp_path):
    recs, _ = _corpus(seed=4)
    rng = random.Random(4)
    template = _poem(rng, 40)  # a family of near copies: clusters joined through several pairs and groups
    recs += [_rec("c.json", i, _substitute(template, 3 + i % 30, "云" if i % 2 else "雨")) for i in range(12)]
    recs += [_rec("d.json", i, template) for i in range(3)]
    _write(tmp_path / "in", recs, per_shard=70)
    runs = {}
    for name, parts in (
        ("one", Partitions(exact_docs=10**9, bucket_items=10**9, verify_pairs=10**9)),
        ("many", Partitions(exact_docs=7, bucket_items=5, verify_pairs=3)),
    ):
        rep, out = tmp_path / f"rep-{name}", tmp_path / f"out-{name}"
        build_dedup_report(tmp_path / "in", rep, DedupSettings(chunk_bytes=3000), workers=1, partitions=parts)
        write_deduped(tmp_path / "in", rep, out, workers=1)
        runs[name] = _decisions(rep, out)
        partitions = json.loads((rep / REPORT_FILE).read_text())["partitions"]
        if name == "many":  # every partitioned step really ran as several tasks
            assert min(partitions["digest_ranges"], partitions["band_hash_ranges"], partitions["verify_ranges"]) > 1
        else:
            assert partitions["digest_ranges"] == partitions["band_hash_ranges"] == partitions["verify_ranges"] == 1
    assert runs["one"] == runs["many"]
    counts = runs["one"][0]
    assert counts["near_duplicates_removed"] >= 20 + 12 and counts["components"] >= 50


def test_step_files_are_read_by_slice_as_numpy_would(tmp_path):
    """NpyRows (positioned reads, no mapping) gives the slices and binary searches of np.load and np.searchsorted."""
    rng = np.random.default_rng(0)
    hashes = np.sort(rng.integers(0, 1 << 63, (3, 500), dtype=np.uint64) * np.uint64(2), axis=1)
    words = rng.integers(0, 1 << 63, (3, 500, 2), dtype=np.uint64)
    rows = np.zeros(300, dtype=K.EXACT_DTYPE)
    rows["doc"], rows["rep"] = np.sort(rng.integers(0, 10_000, 300)), rng.integers(0, 10_000, 300)
    for name, arr in (("h", hashes), ("w", words), ("e", rows)):
        np.save(tmp_path / f"{name}.npy", arr)
    with NpyRows(tmp_path / "h.npy") as f:
        for band in range(3):
            for value in (0, int(hashes[band, 17]), int(hashes[band, 17]) + 1, (1 << 64) - 1, 1 << 64):
                want = len(hashes[band]) if value >= 1 << 64 else np.searchsorted(hashes[band], np.uint64(value))
                assert f.searchsorted((band,), value) == want
            assert np.array_equal(f.read((band,), 40, 90), hashes[band, 40:90])
    with NpyRows(tmp_path / "w.npy") as f:
        assert np.array_equal(f.read((2,), 0, 500), words[2]) and f.read((1,), 7, 7).shape == (0, 2)
    with NpyRows(tmp_path / "e.npy") as f:
        a = f.searchsorted((), int(rows["doc"][100]), "doc")
        assert a == np.searchsorted(rows["doc"], rows["doc"][100])
        assert np.array_equal(f.read((), a, 300), rows[a:])


def test_oversized_bucket_is_handled_and_counted(tmp_path):
    rng = random.Random(8)
    t = _poem(rng, 60)
    # 40 one-substitution copies: they share most band buckets, far above max_bucket=5
    recs = [_rec("o.json", i, _substitute(t, i % 60, "龍")) for i in range(40)]
    _write(tmp_path / "in", recs)
    settings = DedupSettings(max_bucket=5)
    stats = build_dedup_report(
        tmp_path / "in", tmp_path / "rep", settings, workers=1, partitions=Partitions(bucket_items=7, verify_pairs=10)
    )
    report = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())
    assert stats["oversized_buckets"] > 0 and report["counts"]["oversized_buckets"] == stats["oversized_buckets"]
    assert stats["pairs_not_emitted"] > 0
    # neighbours in signature order: at most 4m pairs per oversized bucket, not m^2 / 2; the family still
    # collapses to a few survivors, each removal verified against the record it names
    assert stats["candidate_pairs"] < 40 * 39 // 2
    assert stats["docs_out"] <= 4 and stats["dropped_near_duplicate"] == 40 - stats["docs_out"]


def _low_entropy(n: int, seed: int = 0) -> list[dict]:
    """~200-character documents of words made of 16 syllables (their MinHash minima collide, so LSH buckets grow
    with the corpus), one in 20 a near copy of an earlier one with a word replaced."""
    rng = random.Random(seed)
    syl = ["ka", "to", "ri", "ne", "su", "mo", "la", "pi", "do", "ve", "shi", "gu", "ba", "ze", "fo", "hu"]
    vocab = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(2000)]
    docs = []
    for i in range(n):
        if i > 10 and i % 20 == 0:
            words = list(docs[rng.randrange(i)])
            words[rng.randrange(len(words))] = rng.choice(vocab)
        else:
            words = [rng.choice(vocab) for _ in range(32)]
        docs.append(words)
    return [_rec("low.json", i, " ".join(w)) for i, w in enumerate(docs)]


def test_low_entropy_candidates_bounded_per_document(tmp_path):
    _write(tmp_path / "in", _low_entropy(1000))
    # 32 bands of 2 rows: buckets of hundreds of documents already at this size (as 16 x 8 at millions); character
    # shingles: the syllables' minima collide (word shingles of these texts are not low-entropy)
    bounded = DedupSettings(bands=32, rows=2, max_bucket=8, bucket_neighbours=2, shingles="chars")
    unbounded = DedupSettings(bands=32, rows=2, max_bucket=4096, shingles="chars")  # above any bucket of 1000 docs
    runs = {}
    for name, settings in (("bounded", bounded), ("unbounded", unbounded)):
        runs[name] = build_dedup_report(tmp_path / "in", tmp_path / name, settings, workers=1)
        write_deduped(tmp_path / "in", tmp_path / name, tmp_path / f"out-{name}", workers=1)
    b, u = runs["bounded"], runs["unbounded"]
    # a document has at most max_bucket - 1 candidates per band in a bucket within the limit, 2 * neighbours in an
    # oversized one, so the pairs grow linearly with the corpus; every pair of every bucket is 4x that bound
    bound = 1000 * 32 * max(bounded.max_bucket - 1, 2 * bounded.bucket_neighbours) // 2
    assert b["candidate_pairs"] <= bound and u["candidate_pairs"] > 4 * bound
    report = json.loads((tmp_path / "bounded" / REPORT_FILE).read_text())
    assert report["counts"]["oversized_buckets"] == b["oversized_buckets"] > 0 and b["pairs_not_emitted"] > 0
    assert u["oversized_buckets"] == 0
    # the signature pre-filter leaves almost none of these false candidates to the exact comparison
    assert report["counts"]["signature_rejected"] == b["signature_rejected"]
    assert b["signature_rejected"] > 0.99 * (b["candidate_pairs"] - b["verified_pairs"])
    assert report["parameters"]["signature_filter"]["min_agreement"] == 73  # of 128 at threshold 0.8
    # the near copies are found as with every pair of every bucket
    assert b["dropped_near_duplicate"] == u["dropped_near_duplicate"] > 40
    removed = [(tmp_path / f"out-{name}" / REMOVED_FILE).read_bytes() for name in runs]
    assert removed[0] == removed[1]


@pytest.mark.parametrize(
    "values,field",
    [
        ({"keep": "newest"}, "dedup_report.keep"),
        ({"threshold": 1.5}, "dedup_report.threshold"),
        ({"shingle_hash": "md5"}, "dedup_report.shingle_hash"),
        ({"ngram_bounds": [1000, 100]}, "dedup_report.ngram_bounds"),
    ],
)
def test_invalid_settings_are_refused_naming_the_field(values, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_settings(DedupSettings, values)


def test_bands_times_rows_beyond_num_perm_is_refused():
    with pytest.raises(ConfigError) as e:
        load_settings(DedupSettings, {"bands": 20, "rows": 8, "num_perm": 128})
    assert all(word in str(e.value) for word in ("dedup_report", "bands", "rows", "num_perm", "160"))
    with pytest.raises(ConfigError, match="bands"):
        load_settings(DedupSettings, {"bands": 4})


def test_malformed_line_in_cleaned_jsonl_is_corruption(tmp_path):
    recs, _ = _corpus()
    _write(tmp_path / "in", recs[:20])
    with open(tmp_path / "in" / "part-00000.jsonl", "a", encoding="utf-8") as f:
        f.write("\n{not json\n")
    with pytest.raises(CorruptOutputError, match=r"part-00000\.jsonl:22: not a JSON record"):
        build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
