"""No pickle under a data root (issue 45, 3): a file there that some node unpickles turns write access to the data
root into code execution on that node. A full dedup (dedup_report and deduped_jsonl materialized, local engine)
leaves none, and neither does its staging folder while the run still holds it (cluster_parts, removed when the
report is written: the snapshot is taken just before); a part's clustering comes back whole from its arrays."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
from support import BATCH, materialize_batch, planted_dedup_corpus, write_records

import tokenmill.stages.dedup.stage as dedup_stage
from tokenmill.stages.dedup import DedupSettings, Partitions, build_dedup_report
from tokenmill.stages.dedup.layout import CLUSTER_PART_DIR

PICKLE_NAMES = (".pickle", ".pkl")


def is_pickle(path: Path) -> bool:
    """A pickle by its name or its first bytes (protocol 2 and later open with PROTO: 0x80, then 2-5)."""
    if path.name.endswith(PICKLE_NAMES):
        return True
    with open(path, "rb") as f:
        head = f.read(2)
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def files_under(root: Path) -> list[Path]:
    """Every file under `root`, hidden folders (batch versions, staging) included; links not followed."""
    return [Path(d) / n for d, _, names in os.walk(root) for n in names if not (Path(d) / n).is_symlink()]


def pickles_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in files_under(root) if is_pickle(p))


def test_the_checker_knows_a_pickle(tmp_path):
    import pickle

    (tmp_path / "a.bin").write_bytes(pickle.dumps({"x": 1}, protocol=2))
    (tmp_path / "b.bin").write_bytes(pickle.dumps({"x": 1}, protocol=pickle.HIGHEST_PROTOCOL))
    (tmp_path / "c.pkl").write_bytes(b"")
    np.save(tmp_path / "d.npy", np.arange(3))
    np.savez(tmp_path / "e.npz", a=np.arange(3))
    (tmp_path / "f.jsonl").write_text('{"a": 1}\n')
    assert pickles_under(tmp_path) == ["a.bin", "b.bin", "c.pkl"]


def test_a_full_dedup_leaves_no_pickle_in_the_data_root(tmp_path, monkeypatch):
    from assets.dedup import dedup_batch_assets, deduped_jsonl

    seen: dict[str, list[str]] = {}
    report = dedup_stage._report

    def report_then_look(run, *args, **kw):  # before the step files and the staging folder are removed
        seen["staged"] = sorted(str(p.relative_to(tmp_path)) for p in files_under(tmp_path / "dedup_report"))
        seen["pickles"] = pickles_under(tmp_path)
        return report(run, *args, **kw)

    monkeypatch.setattr(dedup_stage, "_report", report_then_look)
    recs, _ = planted_dedup_corpus()
    write_records(tmp_path / "cleaned_jsonl" / BATCH, recs, per_shard=100)
    result = materialize_batch(
        [dedup_batch_assets, deduped_jsonl],
        tmp_path,
        tmp_path / "cleaned_jsonl",
        run_config={"ops": {"dedup_report": {"config": {"sample_clusters": 4}}}},
    )
    assert result.success
    md = result.asset_materializations_for_node("dedup_report")[0].metadata
    assert "removed" in md["sample_clusters"].value  # the samples were read back from the parts' clusterings
    # the snapshot saw the parts' staged files (the clustering each part keeps for the samples among them)
    assert any(f"/{CLUSTER_PART_DIR}/" in p for p in seen["staged"]), seen["staged"]
    assert seen["pickles"] == [], seen["pickles"]
    assert pickles_under(tmp_path) == []


def _same(a, b) -> bool:
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def test_a_parts_clustering_comes_back_whole_from_its_arrays(tmp_path, monkeypatch):
    """Every field of every part's Clusters (its document table too) is read back with its type, dtype and value,
    from an .npz that numpy loads with allow_pickle=False."""
    import tokenmill.stages.dedup.cluster_parts as cp

    checked = []
    save = cp.save_clustering

    def save_and_compare(path, c):
        save(path, c)
        assert path.name.endswith(".npz") and not is_pickle(path)
        assert _same(c, cp.load_clustering(path))
        checked.append(path.name)

    monkeypatch.setattr(cp, "save_clustering", save_and_compare)
    recs, _ = planted_dedup_corpus()
    write_records(tmp_path / "in", recs, per_shard=90)
    parts = Partitions(exact_docs=10**9, bucket_items=10**9, verify_pairs=10**9, cluster_docs=20)
    settings = DedupSettings(chunk_bytes=4096, sample_clusters=8)
    build_dedup_report(tmp_path / "in", tmp_path / "rep", settings, workers=1, partitions=parts)
    assert len(checked) > 1
