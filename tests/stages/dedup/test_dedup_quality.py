"""The dedup quality estimate (quality.py) against the truth of corpora with planted near duplicates."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from support import dedup_record, random_poem, substitute, write_records

from tokenmill.stages.dedup import DECISION_DIR, REPORT_FILE, DedupSettings, build_dedup_report
from tokenmill.stages.dedup import minhash as mh
from tokenmill.stages.dedup.quality import wilson


def _families(rng: random.Random, families: int, copies: int) -> list[str]:
    """Pages copied many times, each copy with 2-3 of its 90 characters changed (0.87-0.91 to its page, 0.76-0.84
    between copies: half the pairs of copies are near duplicates), between unrelated poems."""
    texts = []
    for _ in range(families):
        base = random_poem(rng, 90)
        texts.append(base)
        for _ in range(copies):
            text = base
            for pos in rng.sample(range(90), rng.choice((2, 3))):
                text = substitute(text, pos, rng.choice("甲乙丙丁戊己庚辛"))
            texts.append(text)
        texts += [random_poem(rng, 90) for _ in range(20)]
    return texts


def _truth_recall(texts: list[str], ids: list[str], report_dir, threshold: float) -> float:
    """Near pairs (exact Jaccard of 2-grams >= threshold) whose records ended in one cluster, of all."""
    sets = [mh.shingle_set(t, 2) for t in texts]
    cluster = {x: x for x in ids}
    for f in sorted((report_dir / DECISION_DIR).glob("*.npz")):
        z = np.load(f)
        cluster.update({a.decode(): b.decode() for a, b in zip(z["id"].tolist(), z["kept_id"].tolist())})
    near = found = 0
    for i in range(len(texts)):
        for j in range(i + 1, len(texts)):
            if mh.jaccard(sets[i], sets[j]) >= threshold:
                near += 1
                found += cluster[ids[i]] == cluster[ids[j]]
    return found / near


@pytest.mark.parametrize(
    "settings",
    [
        # neighbours only, first seen wins (no second look): copies never compared stay apart (truth ~0.42)
        DedupSettings(max_bucket=4, bucket_neighbours=1, bucket_hubs=0, keep="first_seen"),
        # the defaults but small buckets: hubs and components join nearly every pair
        DedupSettings(max_bucket=4),
    ],
    ids=["neighbours-first-seen", "hubs-components"],
)
def test_recall_interval_covers_the_truth(tmp_path, settings):
    texts = _families(random.Random(11), families=3, copies=60)
    recs = [dedup_record("q.json", i, t) for i, t in enumerate(texts)]
    write_records(tmp_path / "in", recs)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", settings, workers=1)
    quality = json.loads((tmp_path / "rep" / REPORT_FILE).read_text())["quality"]
    truth = _truth_recall(texts, [r["id"] for r in recs], tmp_path / "rep", settings.threshold)
    assert quality["recall_low"] <= truth <= quality["recall_high"], (truth, quality)
    assert abs(quality["recall"] - truth) < 0.1 and quality["sampled_pairs"] > 0
    # every removal is measured: the star walk removes only records at the threshold to the one they name
    assert quality["direct_precision"] == 1.0 or settings.cluster_mode() == "components"


def test_estimate_is_seeded_by_the_data(tmp_path):
    texts = _families(random.Random(3), families=1, copies=40)
    write_records(tmp_path / "in", [dedup_record("q.json", i, t) for i, t in enumerate(texts)])
    settings = DedupSettings(max_bucket=4, bucket_neighbours=1, bucket_hubs=0, keep="first_seen")
    runs = []
    for name, workers in (("one", 1), ("two", 2)):
        build_dedup_report(tmp_path / "in", tmp_path / name, settings, workers=workers)
        runs.append(json.loads((tmp_path / name / REPORT_FILE).read_text())["quality"])
    assert runs[0] == runs[1]


def test_wilson_interval():
    low, high = wilson(0, 100)
    assert low < 1e-12 and 0.04 < high < 0.06
    low, high = wilson(50, 100)
    assert low < 0.5 < high and abs((0.5 - low) - (high - 0.5)) < 1e-12
    assert wilson(0, 0) == (0.0, 1.0)


def test_quality_check_warns_or_blocks_below_the_floor():
    import dagster as dg

    from assets.checks import dedup_report_quality

    good = {"quality": {"recall": 0.99, "recall_low": 0.97, "recall_high": 1.0, "recall_floor": 0.95}}
    bad = {"quality": {"recall": 0.96, "recall_low": 0.90, "recall_high": 0.99, "recall_floor": 0.95}}
    assert dedup_report_quality(good, blocking=False).passed
    warned = dedup_report_quality(bad, blocking=False)
    assert not warned.passed and warned.severity == dg.AssetCheckSeverity.WARN
    assert dedup_report_quality(bad, blocking=True).severity == dg.AssetCheckSeverity.ERROR


def test_a_blocking_quality_check_refuses_the_batch_through_a_materialization(tmp_path):
    """dedup_report materialized for real over a batch whose recall is poor (neighbours only, no second look): as a
    warning the report is published with the failed check; with quality_blocking the step fails, the check's
    evaluation is recorded failed, and nothing is published for the batch."""
    from support import materialize_batch

    from assets.clean import cleaned_jsonl
    from assets.dedup import dedup_batch_assets
    from assets.raw import raw_records

    source = tmp_path / "source"
    source.mkdir()
    texts = _families(random.Random(11), families=3, copies=60)
    (source / "q.jsonl").write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in texts))
    poor = {"max_bucket": 4, "bucket_neighbours": 1, "bucket_hubs": 0, "keep": "first_seen"}

    def run(root, blocking: bool):
        config = {"ops": {"dedup_report": {"config": {**poor, "quality_blocking": blocking}}}}
        assets = [raw_records, cleaned_jsonl, dedup_batch_assets]
        return materialize_batch(assets, root, source, config, raise_on_error=False)

    warned = run(tmp_path / "warned", blocking=False)
    assert warned.success
    (check,) = [e for e in warned.get_asset_check_evaluations() if e.check_name == "dedup_report_quality"]
    assert not check.passed and check.severity.value == "WARN"
    assert (tmp_path / "warned" / "dedup_report" / "g1-b000001" / REPORT_FILE).exists()

    blocked = run(tmp_path / "blocked", blocking=True)
    assert not blocked.success
    (check,) = [e for e in blocked.get_asset_check_evaluations() if e.check_name == "dedup_report_quality"]
    assert not check.passed and check.severity.value == "ERROR"
    assert not (tmp_path / "blocked" / "dedup_report" / "g1-b000001").exists()
