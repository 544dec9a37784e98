"""The web rules keep and drop the documents datatrove's FineWeb filters keep and drop (same thresholds), on the
Common Crawl sample and line windows cut from it (benchmarks/bench_quality.py measures 5,000 of them)."""

import importlib.util

import pytest

from tests.conftest import REPO

pytest.importorskip("datatrove", reason="datatrove is the reference implementation (pip install -e '.[bench]')")
pytest.importorskip("spacy", reason="datatrove counts English words with spaCy (pip install -e '.[bench]')")

MIN_AGREEMENT = 0.99  # one document in a hundred; the benchmark's 5,000 documents hold the rules to 99.5%


def _bench():
    spec = importlib.util.spec_from_file_location("bench_quality", REPO / "benchmarks" / "bench_quality.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_filter_agrees_with_datatrove(shared_dir):
    bench = _bench()
    pages = bench.read_texts(sorted((shared_dir / "corpora" / "commoncrawl-sample").glob("*.jsonl")))
    texts = pages + bench.line_windows(pages, 300)
    rows = bench.agreement(texts, bench.datatrove_filters(), bench.QualitySettings())
    assert {r["filter"] for r in rows} == {"gopher_repetition", "gopher_quality", "c4", "fineweb"}
    for r in rows:
        assert r["agreement"] >= MIN_AGREEMENT, r
        assert abs(r["drop_datatrove"] - r["drop_tokenmill"]) <= 1 - MIN_AGREEMENT, r
