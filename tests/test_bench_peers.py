"""benchmarks/bench_peers.py's ground truth: the prefix-filter join finds exactly the pairs at the threshold that
comparing every pair finds, and removals are scored per group of true duplicates whichever copy is kept."""

import importlib.util
import itertools
import random

import numpy as np
import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_peers", REPO / "benchmarks" / "bench_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_sets(seed: int) -> list[np.ndarray]:
    """Sets of 1-40 shingles from 300, each with 0-2 copies that have up to 3 shingles replaced."""
    rng = random.Random(seed)
    sets = []
    for _ in range(150):
        base = [rng.randrange(300) for _ in range(rng.randrange(1, 40))]
        sets.append(base)
        for _ in range(rng.randrange(3)):
            copy = list(base)
            for _ in range(rng.randrange(4)):
                copy[rng.randrange(len(copy))] = rng.randrange(300)
            sets.append(copy)
    return [np.unique(np.asarray(s, dtype=np.uint64)) for s in sets]


def all_pairs(sets: list[np.ndarray], threshold: float) -> set[tuple[int, int]]:
    found = set()
    for i, j in itertools.combinations(range(len(sets)), 2):
        a, b = set(sets[i].tolist()), set(sets[j].tolist())
        if len(a & b) >= threshold * len(a | b) - 1e-9:
            found.add((i, j))
    return found


@pytest.mark.parametrize("threshold", [0.5, 0.8, 1.0])
@pytest.mark.parametrize("chunked", [False, True])
def test_join_finds_every_pair_at_the_threshold(bench, monkeypatch, threshold, chunked):
    if chunked:  # pairs generated and verified a few at a time
        monkeypatch.setattr(bench, "JOIN_PAIRS", 50)
        monkeypatch.setattr(bench, "VERIFY_SHINGLES", 50)
    sets = random_sets(seed=int(threshold * 10))
    want = all_pairs(sets, threshold)
    assert len(want) > 20  # enough pairs to mean something
    assert {tuple(p) for p in bench.similar_pairs(sets, threshold).tolist()} == want


def test_word_shingles_join_as_ids(bench):
    """str shingle sets (one shingle very long, as a URL makes one) are joined as int ids with the same pairs."""
    sets = random_sets(seed=3)
    words = [
        np.unique(np.asarray([f"w{v}" * (1 + v // 100) for v in x.tolist()] + ["u" * 500] * (i == 0)))
        for i, x in enumerate(sets)
    ]
    ids = bench.numeric_sets(words)
    assert all(x.dtype == np.int64 and len(x) == len(w) for x, w in zip(ids, words))
    want = all_pairs([np.asarray(sorted(hash(v) for v in w.tolist())) for w in words], 0.8)
    assert {tuple(p) for p in bench.similar_pairs(ids, 0.8).tolist()} == want


def test_score_counts_one_keeper_per_group(bench):
    roots = np.asarray([0, 0, 0, 3, 4, 4])  # groups {0, 1, 2}, {3}, {4, 5}: 3 removable
    removed = np.zeros(6, dtype=bool)
    removed[[1, 2]] = True  # the right number from the first group, whichever copies
    assert bench.score(removed, roots) == {"removed": 2, "correct": 2, "recall": 2 / 3, "precision": 1.0}
    removed[[0, 3]] = True  # every copy of the first group, and a record without duplicates
    assert bench.score(removed, roots) == {"removed": 4, "correct": 2, "recall": 2 / 3, "precision": 0.5}


def test_truth_joins_exact_and_near_copies(bench):
    poem = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"
    near = poem.replace("故乡", "故园")
    other = "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。"
    texts = [poem, poem.replace("，", "、"), near, other, ""]  # an exact copy (same key), a near one, others
    truth = bench.truth_components(texts, ["zh"] * 5, bench.DedupSettings())
    roots = truth.roots
    assert roots.tolist()[:3] == [roots[0]] * 3 and len(set(roots.tolist())) == 3
    assert truth.counts["removable"] == 2
    kept_all = np.zeros(5, dtype=bool)
    assert bench.pairs_left(kept_all, truth) == 3  # the exact copies, and the near one with each of them
    assert bench.pairs_left(np.array([False, True, False, False, False]), truth) == 1


def test_missed_removals_are_told_apart_as_pairs_never_found_and_chains(bench):
    """a ~ b ~ c (each two characters changed from the last) while a and c are below the threshold."""
    a = "床前明月光疑是地上霜举头望明月低头思故乡春眠不觉晓处处闻啼鸟夜来风雨声花落知多少"

    def changed(text: str, at: int) -> str:
        chars = list(text)
        chars[at], chars[at + 5] = "甲", "乙"
        return "".join(chars)

    b = changed(a, 0)
    c = changed(b, 2)
    settings = bench.DedupSettings()
    truth = bench.truth_components([a, b, c], ["zh"] * 3, settings)
    roots, shingles = truth.roots, truth.shingles
    assert len(set(roots.tolist())) == 1 and truth.counts["removable"] == 2
    kept_all = np.zeros(3, dtype=bool)
    assert bench.missed_kinds(roots, kept_all, shingles, settings) == {"direct": 2, "chain": 0}
    assert bench.pairs_left(kept_all, truth) == 2  # a ~ b and b ~ c
    b_removed = np.array([False, True, False])  # a and c kept: joined only through b
    assert bench.missed_kinds(roots, b_removed, shingles, settings) == {"direct": 0, "chain": 1}
    assert bench.pairs_left(b_removed, truth) == 0
