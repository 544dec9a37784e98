"""dedup level 2: shingle hashes and MinHash signatures identical to datasketch, the n-gram rule and its length
bound."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from support import dedup_record, random_poem, write_records

from tokenmill.stages.dedup import (
    REPORT_FILE,
    DedupSettings,
    build_dedup_report,
)
from tokenmill.stages.dedup import minhash as mh

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
    keys = KEYS + [random_poem(rng, rng.randint(1, 300)) for _ in range(30)]
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
    a = random_poem(rng, 98)
    b = a + random_poem(rng, 4)  # 102 chars: 3-grams on its own, 2-grams for the 98-char original
    write_records(tmp_path / "in", [dedup_record("x.json", 0, a), dedup_record("x.json", 1, b)])
    stats = build_dedup_report(tmp_path / "in", tmp_path / "rep", DedupSettings(), workers=1)
    assert stats.dropped["near_duplicate"] == 1


def test_reordered_short_latin_lines_are_not_near_duplicates(tmp_path):
    """Word shingles for space-separated scripts: a reordered short line is another line (character 2-grams of
    its key called it a near duplicate at Jaccard 0.90); a word changed in a longer text still is one."""
    rng = random.Random(5)
    words = [f"{w}{rng.randint(0, 9)}" for w in ("alpha", "beta", "gamma", "delta") * 12]
    long_text = " ".join(words)
    recs = [
        dedup_record("s.txt", 0, "BRUTUS:\nAEdiles, seize him!"),
        dedup_record("s.txt", 1, "BRUTUS:\nSeize him, AEdiles!"),
        dedup_record("s.txt", 2, long_text),
        dedup_record("s.txt", 3, long_text.replace(words[20], "zeta", 1)),
    ]
    write_records(tmp_path / "in", recs)
    for shingles, near in (("by_script", 1), ("chars", 2)):
        rep = tmp_path / f"rep-{shingles}"
        stats = build_dedup_report(tmp_path / "in", rep, DedupSettings(shingles=shingles), workers=1)
        assert stats.dropped["near_duplicate"] == near
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
    assert stats.docs_in > 7000 and stats.dropped["near_duplicate"] == 0
