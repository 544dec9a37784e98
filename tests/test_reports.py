"""tokenmill.reports: the funnel, drops and dedup clusters of a two-batch graph run as DataFrames (a raw drop, a
clean drop, exact and near duplicates within a batch and of the earlier batch), read without Dagster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import two_batch_graph

from tokenmill import reports
from tokenmill.common.io import REMOVED_FILE, STATS_FILE, batch_folders, iter_jsonl
from tokenmill.stages.telemetry import RECORD_STAGES, dropped_counts

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """a.jsonl: 40 records, exact and near copies of its records 1 and 2, a line that is not JSON, a too-short text;
    then b.jsonl: 40 records, exact and near copies of a.jsonl's 3 and 4 (as tests/test_explain.py's graph)."""
    return two_batch_graph(tmp_path_factory.mktemp("reports"))[0]


@pytest.mark.slow  # the module fixture runs the whole graph (~10 s)
@pytest.mark.timeout(600)
def test_funnel_conserves_records_per_stage_and_batch_and_matches_the_stats(data):
    frame = reports.funnel(data)
    assert set(frame["batch"]) == {"g1-b000001", "g1-b000002"}
    per_stage = frame.groupby(["batch", "stage"], observed=True)
    totals = per_stage.agg(
        records_in=("records_in", "first"),
        records_out=("records_out", "first"),
        records_dropped=("records_dropped", "first"),
        dropped=("dropped", "sum"),
    )
    assert (totals["records_in"] == totals["records_out"] + totals["records_dropped"]).all()
    assert (totals["records_dropped"] == totals["dropped"]).all()
    assert frame["conserved"].all() and frame["linked"].all()
    for key, _ in RECORD_STAGES[:3]:  # tokenized_bins' per-batch figures live in its one _stats.json
        for folder in batch_folders(data / key):
            stats = json.loads((folder / STATS_FILE).read_text())
            rows = frame[(frame["batch"] == folder.name) & (frame["stage"] == key)]
            assert (rows["records_in"] == stats["docs_in"]).all() and (rows["records_out"] == stats["docs_out"]).all()
            nonzero = {r: n for r, n in dropped_counts(stats).items() if n}
            assert dict(zip(rows["reason"].dropna(), rows.loc[rows["reason"].notna(), "dropped"])) == nonzero
    first = frame[frame["batch"] == "g1-b000001"].set_index(["stage", "reason"])["dropped"]
    assert first[("raw_records", "malformed_json")] == 1 and first[("cleaned_jsonl", "too_short")] == 1
    assert str(frame["records_in"].dtype) == "int64" and list(frame["stage"].cat.categories)[0] == "raw_records"


@pytest.mark.slow  # the module fixture runs the whole graph (~10 s)
@pytest.mark.timeout(600)
def test_drops_has_a_row_per_rejected_or_removed_record_with_its_reason_and_source(data):
    frame = reports.drops(data)
    funnel = reports.funnel(data)
    by_stage = funnel.groupby(["batch", "stage"], observed=True)["dropped"].sum()
    counted = frame.groupby(["batch", "stage"], observed=True).size()
    for (batch, stage), n in by_stage.items():
        if stage != "tokenized_bins":
            assert counted.get((batch, stage), 0) == n, (batch, stage)
    assert len(frame) == 6 and frame["reason"].notna().all() and (frame["reason"].str.len() > 0).all()
    assert frame["id"].str.fullmatch("[0-9a-f]{16}").all() and frame["source_path"].notna().all()
    raw = frame[frame["stage"] == "raw_records"].iloc[0]
    assert (raw["reason"], raw["source_path"], raw["source_line"]) == ("malformed_json", "a.jsonl", 43)
    assert raw["text"] == '{"text": "cut'
    clean = frame[frame["stage"] == "cleaned_jsonl"].iloc[0]
    assert (clean["reason"], clean["source_line"], clean["text"]) == ("too_short", 44, "short")
    dedup = frame[frame["stage"] == "deduped_jsonl"]
    assert set(dedup["reason"]) == {"exact_duplicate", "near_duplicate"} and dedup["duplicate_of"].notna().all()
    assert all({"level", "similarity"} <= set(e) for e in dedup["evidence"])
    assert len(reports.drops(data, limit=2)) == 2
    assert set(reports.drops(data, stage="deduped_jsonl")["stage"]) == {"deduped_jsonl"}
    with pytest.raises(ValueError):
        reports.drops(data, stage="tokenized_bins")


@pytest.mark.slow  # the module fixture runs the whole graph (~10 s)
@pytest.mark.timeout(600)
def test_dedup_clusters_removed_ids_are_removed_jsonls(data):
    frame = reports.dedup_clusters(data)
    for folder in batch_folders(data / "deduped_jsonl"):
        removed = {e["id"]: e for e in iter_jsonl(folder / REMOVED_FILE)}
        rows = frame[frame["batch"] == folder.name]
        listed = [rid for ids in rows["removed_ids"] for rid in ids]
        assert sorted(listed) == sorted(removed) and len(listed) == len(set(listed))
        for _, row in rows.iterrows():
            for rid, source in zip(row["removed_ids"], row["removed_sources"]):
                entry = removed[rid]
                assert entry["duplicate_of"] == row["kept_id"]
                assert source == f"{entry['source']['path']}:{entry['source']['line']}"
    second = frame[frame["batch"] == "g1-b000002"]
    assert set(second["kept_role"]) == {"indexed"} and set(second["kept_source_line"]) == {3, 4}
    assert (frame["removed_count"] == frame["removed_ids"].map(len)).all()


def test_importing_reports_does_not_import_dagster():
    code = "import sys, tokenmill.reports; print(sorted(m for m in sys.modules if m.split('.')[0] == 'dagster'))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
