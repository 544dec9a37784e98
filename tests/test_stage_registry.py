"""The stage registry (tokenmill/stages/registry.py): one declaration puts a stage in the graph, in the batch lists and
in explain's search order; the lists derived from today's registry are the ones the modules spelled out before it."""

import json

import dagster as dg
import pytest

import assets
from assets.batches import PER_BATCH_ASSETS, REBUILT_STAGES, SOURCE_BATCHES
from assets.clean import cleaned_jsonl
from definitions import ASSETS, stage_assets
from resources import Compute, CorpusSource, DataRoot
from tokenmill.batches import PER_BATCH_STAGES
from tokenmill.common import disk
from tokenmill.common.io import STATS_FILE, record_id
from tokenmill.errors import ConfigError
from tokenmill.explain import explain
from tokenmill.stages import registry
from tokenmill.stages.telemetry import RECORD_STAGES

SCORED = registry.Stage(key="scored_jsonl", per_batch=True, rebuilt=True, funnel_label="after scoring")


@dg.asset(deps=[cleaned_jsonl], partitions_def=SOURCE_BATCHES)
def scored_jsonl() -> None:
    """The throwaway stage's asset: only its place in the graph is looked at."""


@pytest.fixture
def with_scored(monkeypatch):
    """The registry with SCORED declared after cleaned_jsonl."""
    at = registry.STAGES.index(registry.CLEANED_JSONL) + 1
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES[:at], SCORED, *registry.STAGES[at:]))


def write_batch(stage_dir, record: dict) -> None:
    batch = stage_dir / "g1-b000001"
    batch.mkdir(parents=True)
    (batch / STATS_FILE).write_text("{}")
    (batch / "part-00000.jsonl").write_text(json.dumps(record) + "\n")


def test_a_declared_stage_is_in_the_graph_the_batch_lists_and_explains_search(with_scored, tmp_path):
    found = [*dg.load_assets_from_package_module(assets), scored_jsonl]
    stage_defs = stage_assets(found)
    assert stage_defs[2] is scored_jsonl  # in the registry's order
    resources = {"source": CorpusSource(path="unused"), "data_root": DataRoot(root=str(tmp_path)), "compute": Compute()}
    graph = dg.Definitions(assets=stage_defs, resources=resources).resolve_asset_graph()
    assert graph.get(dg.AssetKey("scored_jsonl")).parent_keys == {dg.AssetKey("cleaned_jsonl")}

    assert registry.per_batch_keys()[:4] == ("raw_records", "cleaned_jsonl", "scored_jsonl", "dedup_report")
    assert registry.rebuilt_keys()[:4] == ("raw_records", "cleaned_jsonl", "scored_jsonl", "dedup_report")
    assert registry.record_stages()[2] == ("scored_jsonl", "after scoring")

    # a record that cleaned_jsonl and scored_jsonl both hold is kept in scored_jsonl, the last stage holding it
    rid = record_id("a.jsonl", line=1)
    for stage in ("cleaned_jsonl", "scored_jsonl"):
        write_batch(tmp_path / stage, {"id": rid, "text": "t", "meta": {}, "source": {"path": "a.jsonl", "line": 1}})
    assert registry.kept_search_order() == ("deduped_jsonl", "scored_jsonl", "cleaned_jsonl", "raw_records")
    fate = explain(tmp_path, rid)
    assert (fate["fate"], fate["stage"], fate["batch"]) == ("kept", "scored_jsonl", "g1-b000001")


def test_the_derived_lists_are_the_ones_spelled_out_before_the_registry():
    per_batch = ("raw_records", "cleaned_jsonl", "dedup_report", "dedup_index", "deduped_jsonl")
    assert PER_BATCH_STAGES == PER_BATCH_ASSETS == per_batch
    assert REBUILT_STAGES == (*per_batch, "tokenizer")
    assert disk.STAGES == (*per_batch, "tokenizer", "tokenized_bins", "funnel_telemetry")
    assert RECORD_STAGES == (
        ("raw_records", "raw records"),
        ("cleaned_jsonl", "after cleaning"),
        ("deduped_jsonl", "after dedup"),
        ("tokenized_bins", "tokenized"),
    )
    assert registry.kept_search_order() == ("deduped_jsonl", "cleaned_jsonl", "raw_records")
    assert [sorted(key.to_user_string() for key in asset.keys) for asset in ASSETS] == [
        ["raw_records"],
        ["cleaned_jsonl"],
        ["dedup_index", "dedup_report"],  # one multi-asset
        ["deduped_jsonl"],
        ["tokenizer"],
        ["tokenized_bins"],
        ["funnel_telemetry"],
    ]


def test_every_declared_type_loads_and_its_settings_name_its_stage():
    assert registry.registry_problems() == []
    assert registry.RAW_RECORDS.settings_class().asset_key == "raw_records"
    assert registry.DEDUPED_JSONL.result_class().__name__ == "DedupApplyResult"
    assert registry.DEDUP_INDEX.settings_class() is None


def test_the_code_location_refuses_a_stage_without_its_asset_an_asset_of_no_stage_and_a_wrong_type(monkeypatch):
    found = dg.load_assets_from_package_module(assets)
    with pytest.raises(ConfigError, match="assets scored_jsonl are no stage"):
        stage_assets([*found, scored_jsonl])
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES, SCORED))
    with pytest.raises(ConfigError, match="no asset produces scored_jsonl"):
        stage_assets(found)
    wrong = registry.Stage(
        key="scored_jsonl", settings="tokenmill.stages.raw:RawSettings", result="tokenmill.stages.raw:Missing"
    )
    monkeypatch.setattr(registry, "STAGES", (*registry.STAGES[:-1], wrong, registry.RAW_RECORDS))
    problems = registry.registry_problems()
    assert problems[0] == "raw_records: declared twice"
    assert problems[1] == "scored_jsonl: tokenmill.stages.raw:RawSettings is the settings of 'raw_records'"
    assert problems[2].startswith("scored_jsonl: tokenmill.stages.raw:Missing does not load") and len(problems) == 3
    with pytest.raises(ConfigError, match="stage registry: raw_records: declared twice"):
        stage_assets([*found, scored_jsonl])
