"""Each asset's code_version is its stage's VERSION constant, so Dagster's staleness follows output changes."""

from definitions import defs
from tokenmill.exports import hf_parquet, megatron, nanogpt
from tokenmill.stages import clean, dedup, raw, telemetry, tokenize

STAGE_OF_ASSET = {
    "raw_records": raw,
    "cleaned_jsonl": clean,
    "dedup_report": dedup,
    "dedup_index": dedup,
    "deduped_jsonl": dedup,
    "tokenizer": tokenize,
    "tokenized_bins": tokenize,
    "funnel_telemetry": telemetry,
    "nanogpt_bins": nanogpt,
    "megatron_indexed": megatron,
    "hf_parquet": hf_parquet,
}


def test_each_asset_code_version_is_its_stage_version():
    versions = {
        key.to_user_string(): version for asset in defs.assets for key, version in asset.code_versions_by_key.items()
    }
    assert set(versions) == set(STAGE_OF_ASSET)
    assert {key: versions[key] for key in STAGE_OF_ASSET} == {key: m.VERSION for key, m in STAGE_OF_ASSET.items()}
