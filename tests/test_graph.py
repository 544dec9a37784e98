"""The whole graph on the demo corpus in a temporary instance: funnel adds up, checks pass, planted faults fail."""

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.batches import register_batches
from cli import main as cli_main
from definitions import build_defs
from resources import Compute, CorpusSource, DataRoot
from runs import run_batches
from tokenmill.common.io import read_json, record_shards

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory, demo_source):
    data = tmp_path_factory.mktemp("data")
    defs = build_defs(CorpusSource(path=str(demo_source)), DataRoot(root=str(data)))
    with dg.instance_for_test() as instance:
        (key,), _ = register_batches(instance, data, demo_source.resolve())
        ((_, result),) = run_batches(defs.resolve_job_def("tokenmill_all"), instance, [key], raise_on_error=True)
        yield defs, result, data, key


def audit(data: Path, key: str) -> dict:
    """Every blocking check's evaluation of an existing data root (the functions the assets run on staged output)."""
    from assets import checks

    return {
        e.check_name: e
        for e in [
            checks.raw_records_not_empty(data / "raw_records" / key),
            checks.cleaned_records_valid(data / "cleaned_jsonl" / key),
            checks.deduped_no_exact_duplicates(data / "deduped_jsonl" / key, data / "dedup_report" / key),
            checks.token_shards_consistent(data / "tokenized_bins", data / "deduped_jsonl", data / "tokenizer"),
        ]
    }


def test_every_check_passes_and_funnel_adds_up(graph_run, demo_manifest):
    _, result, data, _ = graph_run
    assert result.success
    evaluations = result.get_asset_check_evaluations()
    assert len(evaluations) == 6 and all(e.passed for e in evaluations), [
        (e.check_name, e.metadata) for e in evaluations
    ]
    funnel = read_json(data / "funnel_telemetry" / "funnel.json")
    assert funnel["conserved"]
    stages = funnel["stages"]
    for stage in stages:
        assert stage["docs_in"] == stage["docs_out"] + sum(stage["dropped"].values()), stage
    for before, after in zip(stages, stages[1:]):
        assert after["docs_in"] == before["docs_out"]
    assert stages[0]["docs_out"] == demo_manifest["records"]
    assert funnel["tokens"]["total"] == funnel["tokens"]["supervised"] + funnel["tokens"]["masked"] > 0
    assert (data / "funnel_telemetry" / "funnel.svg").read_text(encoding="utf-8").count("<rect") >= 6  # bars drawn


@pytest.mark.skipif(not (SHARED / "tools" / "check_contracts.py").exists(), reason="../shared is not here")
def test_contracts_hold(graph_run):
    _, _, data, _ = graph_run
    out = subprocess.run(
        [sys.executable, str(SHARED / "tools" / "check_contracts.py"), str(data)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout


def test_lineage_from_token_position_to_source(graph_run, capsys):
    _, _, data, _ = graph_run
    manifest = read_json(data / "tokenized_bins" / "train" / "dataset.json")
    position = manifest["totals"]["tokens"] // 2
    assert cli_main(["lineage", str(position), "--data", str(data)]) == 0
    found = json.loads(capsys.readouterr().out)
    record = next(
        json.loads(line)
        for shard in record_shards(data / "deduped_jsonl")
        for line in open(shard, encoding="utf-8")
        if json.loads(line)["id"] == found["record_id"]
    )
    assert found["source"] == record["source"] and found["text_preview"] == record["text"][:200]
    removed = [json.loads(line) for line in open(data / "deduped_jsonl" / "removed.jsonl", encoding="utf-8")]
    kept_with_dups = {r["duplicate_of"] for r in removed}
    assert kept_with_dups, "the demo corpus plants duplicates"


def test_planted_faults_fail_the_right_checks(graph_run, tmp_path):
    _, _, data, key = graph_run
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(data, broken, symlinks=True)
    # a duplicate key slipped into deduped_jsonl: an existing record under a new id
    shard = record_shards(broken / "deduped_jsonl")[0]
    record = json.loads(shard.read_text(encoding="utf-8").splitlines()[0])
    original, record["id"] = record["id"], "ffffffffffffffff"
    with open(shard, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    # a corrupted shard: a token id past the vocabulary
    manifest = read_json(broken / "tokenized_bins" / "train" / "dataset.json")
    bin_path = broken / "tokenized_bins" / "train" / manifest["shards"][0]["name"] / "sequence.bin"
    tokens = np.memmap(bin_path, dtype=manifest["token_dtype"], mode="r+")
    tokens[3] = np.iinfo(tokens.dtype).max
    tokens.flush()
    del tokens
    evaluations = audit(broken, key)
    assert not evaluations["deduped_no_exact_duplicates"].passed
    assert (
        f"ffffffffffffffff duplicates {original} ({shard.name})"
        in evaluations["deduped_no_exact_duplicates"].metadata["problems"].value
    )
    assert not evaluations["token_shards_consistent"].passed
    assert evaluations["raw_records_not_empty"].passed and evaluations["cleaned_records_valid"].passed


def test_record_checks_read_the_figures_their_stages_wrote(graph_run):
    """cleaned_records_valid and deduped_no_exact_duplicates pass from _shards.json (and the dedup index segment)
    without parsing a record: on the staged output in the run, and on the published output."""
    _, result, data, key = graph_run
    in_run = {e.check_name: e for e in result.get_asset_check_evaluations()}
    evaluations = audit(data, key)
    for name in ("cleaned_records_valid", "deduped_no_exact_duplicates"):
        for evaluation in (in_run[name], evaluations[name]):
            assert evaluation.passed and evaluation.metadata["audit"].value == "figures", name


def test_record_checks_parse_every_record_when_the_figures_do_not_vouch(graph_run, tmp_path):
    """A shard edited in place to its own size (CRC-32 differs) is audited record by record and the duplicate
    named by line; deduped_no_exact_duplicates without its index segment, or with figures whose ids are not the
    segment's kept ones, re-derives every key."""
    _, _, data, key = graph_run
    import shutil

    from assets import checks
    from tokenmill.common.io import SHARDS_FILE, atomic_write_json

    broken = tmp_path / "broken"
    shutil.copytree(data, broken, symlinks=True)
    cleaned = broken / "cleaned_jsonl" / key
    shard = record_shards(cleaned)[0]
    lines = shard.read_bytes().split(b"\n")
    first, second = json.loads(lines[0])["id"], json.loads(lines[1])["id"]
    lines[1] = lines[1].replace(second.encode(), first.encode(), 1)
    size = shard.stat().st_size
    shard.write_bytes(b"\n".join(lines))
    assert shard.stat().st_size == size
    evaluation = checks.cleaned_records_valid(cleaned)
    assert not evaluation.passed and evaluation.metadata["audit"].value == "records"
    assert f"{shard.name}:2: duplicate id {first}" in evaluation.metadata["problems"].value

    deduped, report = broken / "deduped_jsonl" / key, broken / "dedup_report" / key
    figures = read_json(deduped / SHARDS_FILE)
    atomic_write_json(deduped / SHARDS_FILE, {**figures, "ids_crc32": figures["ids_crc32"] ^ 1})
    evaluation = checks.deduped_no_exact_duplicates(deduped, report)
    assert evaluation.passed and evaluation.metadata["audit"].value == "records"
    atomic_write_json(deduped / SHARDS_FILE, figures)
    assert checks.deduped_no_exact_duplicates(deduped, report).metadata["audit"].value == "figures"
    shutil.rmtree(broken / "dedup_index")
    evaluation = checks.deduped_no_exact_duplicates(deduped, report)
    assert evaluation.passed and evaluation.metadata["audit"].value == "records"


def test_loader_reads_what_the_pipeline_wrote(graph_run):
    """The format contract end to end: tokenized_bins written by the graph, read by tokenmill_loader."""
    from tokenizers import Tokenizer

    from tokenmill_loader import RecordDataset, TokenDataset, open_store

    _, _, data, _ = graph_run
    train = data / "tokenized_bins" / "train"
    store = open_store(train, verify=True)
    manifest = read_json(train / "dataset.json")
    assert store.num_records == manifest["totals"]["records"]
    windows = TokenDataset(train, seq_len=64)
    item = windows[len(windows) // 2]
    assert item["input_ids"].shape == item["labels"].shape == item["position_ids"].shape == (64,)
    trained = item["labels"] != -100
    assert (item["labels"][trained] == item["input_ids"][trained]).all()  # unshifted labels
    record = RecordDataset(train)[0]
    text = Tokenizer.from_file(str(train / "tokenizer.json")).decode(
        record["input_ids"].tolist(), skip_special_tokens=True
    )
    first_id = read_json(train / manifest["shards"][0]["name"] / "record_ids.json")[0]
    source = next(
        json.loads(line)
        for shard in record_shards(data / "deduped_jsonl")
        for line in open(shard, encoding="utf-8")
        if json.loads(line)["id"] == first_id
    )
    assert source["text"] in text


def test_a_failing_blocking_check_keeps_the_previous_output(graph_run, tmp_path):
    """Cleaning that rejects every record fails cleaned_records_valid on the staged output: the evaluation is
    recorded, the step fails, and the published cleaned_jsonl is still the previous good one."""
    _, _, data, key = graph_run
    import shutil

    root = tmp_path / "data"
    shutil.copytree(data, root, symlinks=True)
    published = root / "cleaned_jsonl" / key
    stats = json.loads((published / "_stats.json").read_text())  # as if built with these settings: other ones are
    stats["settings"]["min_chars"] = 10**6  # refused on a published batch (per-batch settings hold for a generation)
    (published / "_stats.json").write_text(json.dumps(stats))
    before = {p.name: p.read_bytes() for p in sorted(published.iterdir())}
    rerun = build_defs(CorpusSource(path="unused"), DataRoot(root=str(root)))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("source_batch", [key])
        result = dg.materialize(
            [rerun.get_assets_def("cleaned_jsonl")],
            instance=instance,
            partition_key=key,
            raise_on_error=False,
            resources={"data_root": DataRoot(root=str(root)), "compute": Compute()},
            run_config={"ops": {"cleaned_jsonl": {"config": {"min_chars": 10**6}}}},
        )
    assert not result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.check_name == "cleaned_records_valid" and not evaluation.passed
    assert not result.get_asset_materialization_events()
    assert {p.name: p.read_bytes() for p in sorted(published.iterdir())} == before
    assert not [p for p in (root / "cleaned_jsonl").iterdir() if ".staging-" in p.name]


def test_update_reports_a_missing_source_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOKENMILL_SOURCE", str(tmp_path / "nope"))
    assert cli_main(["update"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "TOKENMILL_SOURCE" in err and "nope" in err


def test_update_runs_the_graph_and_prints_a_summary(tmp_path, demo_source):
    env = {**__import__("os").environ, "TOKENMILL_SOURCE": str(demo_source), "TOKENMILL_DATA": str(tmp_path / "data")}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "cli", "update"],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tokenized_bins" in done.stdout and "tokens" in done.stdout
    assert len(done.stdout.splitlines()) < 12 and "DEBUG" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "text, named",
    [
        ("ops: [1, 2", "expected ','"),  # malformed YAML
        ("- a\n- b\n", "expected a mapping"),
        ("ops:\n  dedup_report:\n    config:\n      keep: newest\n", "keep"),  # a choice Dagster's schema refuses
    ],
)
def test_update_refuses_a_bad_run_config_in_one_line(tmp_path, demo_source, monkeypatch, capsys, text, named):
    (tmp_path / "run.yaml").write_text(text)
    monkeypatch.setenv("TOKENMILL_SOURCE", str(demo_source))
    assert cli_main(["update", "-c", str(tmp_path / "run.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "run.yaml" in err and named in err


def test_a_malformed_number_in_the_environment_names_the_variable(monkeypatch):
    from tokenmill.errors import ConfigError
    from tokenmill.settings import number_from_env

    monkeypatch.setenv("TOKENMILL_LOCK_WAIT", "soon")
    with pytest.raises(ConfigError, match="TOKENMILL_LOCK_WAIT.*'soon'"):
        number_from_env("TOKENMILL_LOCK_WAIT", 0.0)
    monkeypatch.setenv("TOKENMILL_WORKERS", "-2")
    with pytest.raises(ConfigError, match="TOKENMILL_WORKERS"):
        number_from_env("TOKENMILL_WORKERS", 0, int)


def test_the_code_location_loads():
    """What `dagster dev` and `dg` load: names unique across jobs, ops and assets, resources complete."""
    from definitions import defs

    dg.Definitions.validate_loadable(defs)
