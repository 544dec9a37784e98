"""The typed funnel (tokenmill.stages.telemetry): built from hand-written stage stats of one source batch, it
survives funnel.json unchanged, and a drop reason no list declares is counted like any other."""

import json
from pathlib import Path

from assets.checks import funnel_conserved
from tokenmill.common.io import STATS_FILE, atomic_write_json
from tokenmill.stages.telemetry import FUNNEL_FILE, Funnel, build_funnel, read_funnel

BATCH = "g1-b000001"


def write_json(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, obj)


def write_data_root(root: Path, cleaned_drops: dict[str, int]) -> Path:
    """A data root of one batch: 10 records read, 1 rejected, cleaning drops `cleaned_drops`, dedup 1."""
    write_json(root / "_batches.json", {"source": "/corpus", "generation": 1, "batches": [{"key": BATCH, "files": {}}]})
    after_clean = 9 - sum(cleaned_drops.values())
    per_batch = {
        "raw_records": {"docs_in": 10, "docs_out": 9, "dropped_malformed_json": 1},
        "cleaned_jsonl": {
            "docs_in": 9,
            "docs_out": after_clean,
            **{f"dropped_{reason}": n for reason, n in cleaned_drops.items()},
            "pii_email": 2,
            "languages": {"en": {"records": after_clean}},
        },
        "deduped_jsonl": {"docs_in": after_clean, "docs_out": after_clean - 1, "dropped_exact_duplicate": 1},
    }
    for key, stats in per_batch.items():
        write_json(root / key / BATCH / STATS_FILE, stats)
    kept = after_clean - 1
    write_json(
        root / "tokenized_bins" / STATS_FILE,
        {
            "docs_in": kept,
            "docs_out": kept,
            "tokens": 100,
            "supervised_tokens": 80,
            "batches": {BATCH: {"docs_in": kept, "docs_out": kept, "tokens": 100}},
            "languages": {"en": {"records": kept, "tokens": 100}},
            "train": {"records": kept - 1, "tokens": 90},
            "val": {"records": 1, "tokens": 10},
        },
    )
    return root


def test_funnel_round_trips_through_its_json(tmp_path):
    funnel = build_funnel(write_data_root(tmp_path, {"too_short": 2}))
    write_json(tmp_path / FUNNEL_FILE, funnel.to_json())
    text = (tmp_path / FUNNEL_FILE).read_text(encoding="utf-8")
    again = read_funnel(tmp_path)
    assert again == funnel and again == Funnel.from_json(json.loads(text))
    assert json.dumps(again.to_json(), ensure_ascii=False, indent=2, sort_keys=True) + "\n" == text
    assert funnel.conserved and funnel.tokens.masked == 20 and funnel.tokens.supervised_share == 0.8
    assert funnel.pii_masked == {"email": 2} and funnel.languages[0].records_tokenized == 6
    (batch,) = funnel.batches
    assert batch.batch == BATCH and batch.tokens == 100 and batch.stages == funnel.stages


def test_an_undeclared_drop_reason_counts_in_the_funnel(tmp_path):
    funnel = build_funnel(write_data_root(tmp_path, {"too_short": 1, "reason_no_list_names": 2}))
    cleaned = funnel.stages[1]
    assert cleaned.dropped == {"reason_no_list_names": 2, "too_short": 1} and cleaned.dropped_total == 3
    assert cleaned.conserved and funnel.batches[0].stages[1].dropped["reason_no_list_names"] == 2
    assert funnel_conserved(funnel).passed


def test_a_stage_that_loses_records_fails_the_check_in_total_and_per_batch(tmp_path):
    root = write_data_root(tmp_path, {"too_short": 2})
    write_json(root / "deduped_jsonl" / BATCH / STATS_FILE, {"docs_in": 7, "docs_out": 6})  # 1 unaccounted for
    funnel = build_funnel(root)
    assert not funnel.conserved and not funnel.batches[0].conserved
    check = funnel_conserved(funnel)
    assert not check.passed
    assert check.metadata["broken_stages"].value == f"deduped_jsonl, deduped_jsonl of batch {BATCH}"
