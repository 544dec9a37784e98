"""cleaned_jsonl's quality-model step: a fastText model trained here on two kinds of generated text scores every
record the rules kept; the threshold and share rules keep what they should, drops carry the score, the rule and the
model as evidence, scores are stored so that a changed rule re-scores nothing and a changed model re-scores, and
without a model nothing changes."""

import json
import random

import numpy as np
import pytest
from support import FAST, SCIENCE, SPAM, clean, make_raw, paragraph

from tokenmill.common.io import REJECTED_FILE, iter_jsonl, record_shards
from tokenmill.explain import explain, render
from tokenmill.quality_training import train_quality_model
from tokenmill.stages.clean import CleanSettings, clean_corpus
from tokenmill.stages.clean.model_scores import keep_share_mask
from tokenmill.stages.quality_model import QualityTrainSettings, model_id
from tokenmill.stages.telemetry import stage_rows

QUALITY_META = ("quality_score", "quality_model")


def mixed(n: int, seed: int) -> tuple[list[str], list[bool]]:
    """n science and n spam paragraphs, interleaved; whether each is science."""
    rng = random.Random(seed)
    texts, good = [], []
    for _ in range(n):
        texts += [paragraph(rng, SCIENCE), paragraph(rng, SPAM)]
        good += [True, False]
    return texts, good


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two fastText models telling science from spam (different seeds, so different files and ids)."""
    folder = tmp_path_factory.mktemp("models")
    texts, good = mixed(60, seed=0)
    (folder / "good.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t, g in zip(texts, good) if g))
    (folder / "bad.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t, g in zip(texts, good) if not g))
    paths = []
    for seed in (1, 2):
        train_quality_model(
            [folder / "good.jsonl"],
            [folder / "bad.jsonl"],
            folder / f"m{seed}",
            QualityTrainSettings(seed=seed, **FAST),
        )
        paths.append(str(folder / f"m{seed}"))
    return paths


def without_quality_meta(record: dict) -> dict:
    return {**record, "meta": {k: v for k, v in record["meta"].items() if k not in QUALITY_META}}


def test_the_threshold_keeps_the_good_kind_with_its_score_and_explains_the_drops(tmp_path, models):
    texts, good = mixed(30, seed=5)
    ids, recs, rej, stats = clean(tmp_path, texts, quality_model=models[0], quality_threshold=0.5)
    assert set(recs) == {i for i, g in zip(ids, good) if g} and set(rej) == {i for i, g in zip(ids, good) if not g}
    mid = model_id(models[0])
    for rec in recs.values():
        assert rec["meta"]["quality_model"] == mid and rec["meta"]["quality_score"] >= 0.5
    entry = rej[ids[1]]
    assert entry["reason"] == "quality_score" and entry["model"] == mid and entry["threshold"] == 0.5
    assert entry["value"] < 0.5 and entry["rule"] == "quality_threshold 0.5"
    assert stats.dropped["quality_score"] == 30 and stats.docs_out == 30
    report = stats.quality_model
    assert report["model"]["id"] == mid and report["kept"] == 30 and report["kept_share"] == 0.5
    assert sum(report["histogram"]["kept"]) == 30 and sum(report["histogram"]["dropped"]) == 30
    assert [e["score"] for e in report["lowest_kept"]] == sorted(e["score"] for e in report["lowest_kept"])
    assert min(e["score"] for e in report["lowest_kept"]) >= max(e["score"] for e in report["highest_dropped"])
    assert report["by_language"]["en"]["records"] == 60 and report["by_source"]["fixture.jsonl"]["records"] == 60
    # the UI: the kept share and mean score as numbers (plotted across runs), the histogram and extremes as tables
    from assets.metadata import cleaned_jsonl_metadata

    shown = cleaned_jsonl_metadata(stats, tmp_path / "out")
    assert shown["quality_kept_share"] == 0.5 and shown["quality_model_scored"] == 60
    assert mid in shown["quality_model"] and "quality_threshold 0.5" in shown["quality_model"]
    assert len(shown["quality_extremes"].value.records) == 10
    # the stage's figures are the rewritten shards'
    shards = json.loads((tmp_path / "out" / "_shards.json").read_text())
    assert sum(s["records"] for s in shards["shards"]) == 30
    # without a model the same records come out, without the step's meta and report
    _, plain, _, plain_stats = clean(tmp_path, texts, name="plain")
    assert {i: without_quality_meta(plain[i]) for i in recs} == {i: without_quality_meta(r) for i, r in recs.items()}
    assert plain_stats.quality_model is None and "quality_score" not in plain_stats.dropped
    assert all("quality_score" not in r["meta"] for r in plain.values())


def test_explain_names_the_score_rule_and_model(tmp_path, models):
    texts, _ = mixed(10, seed=6)
    data = tmp_path / "data"
    ids = make_raw(data / "raw_records" / "batch-1", texts)
    clean_corpus(
        data / "raw_records" / "batch-1",
        data / "cleaned_jsonl" / "batch-1",
        CleanSettings(quality_model=models[0], quality_threshold=0.5),
    )
    fate = explain(data, ids[1])
    assert fate["reason"] == "quality_score" and fate["evidence"]["model"] == model_id(models[0])
    shown = render(fate)
    assert "quality_score" in shown and "quality_threshold 0.5" in shown and model_id(models[0]) in shown


def test_keep_share_keeps_the_top_share_per_batch_and_per_language(tmp_path, models):
    texts, _ = mixed(20, seed=7)
    ids, recs, rej, stats = clean(tmp_path, texts, quality_model=models[0], quality_keep_share=0.25)
    assert len(recs) == 10 and stats.dropped["quality_score"] == 30
    assert min(r["meta"]["quality_score"] for r in recs.values()) >= max(e["value"] for e in rej.values())
    # per language: a quarter of each language's records (meta.language from the source, identification off)
    metas = [{"language": "de" if i % 4 < 2 else "fr"} for i in range(len(texts))]
    _, recs, _, stats = clean(
        tmp_path,
        texts,
        metas=metas,
        name="per-language",
        language_id=False,
        quality_model=models[0],
        quality_keep_share=0.25,
        quality_per_language=True,
    )
    kept_languages = sorted(r["meta"]["language"] for r in recs.values())
    assert kept_languages == ["de"] * 5 + ["fr"] * 5
    assert set(stats.quality_model["cutoffs"]) == {"de", "fr"}


def test_ties_at_a_share_cutoff_go_to_the_smaller_record_id():
    scores = np.array([0.9, 0.5, 0.5, 0.5, 0.1])
    ids = {1: "c", 2: "a", 3: "b"}
    keep, cutoff = keep_share_mask(scores, lambda ix: [ids[i] for i in ix.tolist()], 0.6, "", "rule")
    assert keep.tolist() == [True, False, True, True, False] and cutoff.score == 0.5
    assert keep_share_mask(scores, None, 1.0, "", "rule")[1] is None  # all kept: no cutoff, no ids read


def test_a_changed_rule_rescores_nothing_a_changed_model_rescores(tmp_path, models):
    texts, _ = mixed(15, seed=8)
    raw = tmp_path / "raw" / "batch-1"
    make_raw(raw, texts, per_shard=10)

    def run(name, **settings):
        out = tmp_path / "cleaned" / name
        return clean_corpus(raw, out, CleanSettings(**settings)).quality_model, out

    first, out_first = run("a", quality_model=models[0], quality_threshold=0.5)
    assert (first["model_scored"], first["reused_scores"]) == (30, 0)
    again, _ = run("b", quality_model=models[0], quality_keep_share=0.5)
    assert (again["model_scored"], again["reused_scores"]) == (0, 30)
    other, _ = run("c", quality_model=models[1], quality_threshold=0.5)
    assert (other["model_scored"], other["reused_scores"]) == (30, 0) and other["model"]["id"] != first["model"]["id"]
    # stored scores give the bytes a fresh scoring gives, and the same records as another batch (a rebuild) find them
    rerun, out_rerun = run("d", quality_model=models[0], quality_threshold=0.5)
    assert rerun["reused_scores"] == 30
    raw.rename(raw.with_name("batch-2"))
    raw = raw.with_name("batch-2")
    assert run("e", quality_model=models[0], quality_threshold=0.5)[0]["reused_scores"] == 30
    # a damaged store file is a cache miss: its shard is scored again
    store = next((tmp_path / "cleaned" / "_quality_scores").glob(f"{first['model']['id']}-*/*.npy"))
    store.write_bytes(store.read_bytes()[:20])
    assert run("f", quality_model=models[0], quality_threshold=0.5)[0]["model_scored"] > 0
    for name in [p.name for p in record_shards(out_first)] + [REJECTED_FILE]:
        assert (out_first / name).read_bytes() == (out_rerun / name).read_bytes()


def test_the_score_store_keeps_only_what_some_batch_uses(tmp_path, models):
    """Another model's scores stay while a batch built with it is in the stage folder, and go with that batch."""
    import shutil

    texts, _ = mixed(12, seed=13)
    raw = tmp_path / "raw" / "batch-1"
    make_raw(raw, texts, per_shard=8)
    store = tmp_path / "cleaned" / "_quality_scores"

    def run(name, model):
        return clean_corpus(raw, tmp_path / "cleaned" / name, CleanSettings(quality_model=model)).quality_model

    first = run("a", models[0])
    assert first["store_pruned"] == 0 and len(first["store_files"]) == 3
    assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*.npy")) == first["store_files"]
    other = run("b", models[1])
    assert other["store_pruned"] == 0 and len(list(store.rglob("*.npy"))) == 6  # batch a still uses its files
    shutil.rmtree(tmp_path / "cleaned" / "a")
    again = run("c", models[1])
    assert (again["store_pruned"], again["reused_scores"]) == (3, 24)
    assert sorted(p.relative_to(store).as_posix() for p in store.rglob("*.npy")) == other["store_files"]
    model_folder = other["store_files"][0].split("/")[0]  # the other model's folder and linear form are gone
    assert sorted(p.name for p in store.iterdir()) == [model_folder, model_folder.split("-t")[0] + ".linear-v1.npz"]


def test_the_funnel_shows_the_model_step_as_its_own_row(tmp_path, models):
    texts, _ = mixed(10, seed=9)
    _, _, _, stats = clean(tmp_path, texts, quality_model=models[0], quality_threshold=0.5)
    written = json.loads((tmp_path / "out" / "_stats.json").read_text())
    rows = stage_rows([("raw_records", "raw", {"docs_in": 20, "docs_out": 20}), ("cleaned_jsonl", "cleaned", written)])
    assert [r.stage for r in rows] == ["raw_records", "cleaned_jsonl", "quality_model"]
    assert all(r.conserved_and_linked for r in rows)
    assert rows[2].docs_in == 20 and rows[2].docs_out == 10 and rows[2].dropped == {"quality_score": 10}
    assert "quality_score" not in rows[1].dropped


def test_a_missing_model_is_one_line_before_any_work(tmp_path):
    from tokenmill.errors import ConfigError

    make_raw(tmp_path / "raw", ["a text long enough to keep"])
    with pytest.raises(ConfigError, match="quality_model: no such file or folder: .*nowhere.bin"):
        clean_corpus(tmp_path / "raw", tmp_path / "out", CleanSettings(quality_model=str(tmp_path / "nowhere.bin")))
    assert not list(iter_jsonl_safe(tmp_path / "out"))


def iter_jsonl_safe(folder):
    return [r for shard in record_shards(folder) for r in iter_jsonl(shard)] if folder.exists() else []


def test_a_transformers_model_scores_on_the_cpu_and_its_share_rule_holds(tmp_path):
    from devtools.tiny_models import random_bert

    texts, _ = mixed(10, seed=10)
    folder = random_bert(tmp_path / "bert", texts, hidden=32, layers=2, vocab_size=300, max_positions=128)
    _, recs, rej, stats = clean(
        tmp_path, texts, quality_model=str(folder), quality_model_device="cpu", quality_keep_share=0.5
    )
    report = stats.quality_model
    assert report["model"]["kind"] == "transformers" and report["model"]["id"] == model_id(folder)
    assert len(recs) == 10 and len(rej) == 10 and report["model_scored"] == 20
    assert min(r["meta"]["quality_score"] for r in recs.values()) >= max(e["value"] for e in rej.values())


def test_update_with_a_quality_model_runs_the_graph_and_counts_its_step(tmp_path, models):
    """The whole graph through `tokenmill update -c`: the step's row in the summary and in funnel.json, conserved
    and linked, and the funnel check passing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    texts, _ = mixed(30, seed=11)
    source = tmp_path / "source"
    source.mkdir()
    (source / "mixed.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "run.yaml").write_text(
        f"ops:\n  cleaned_jsonl:\n    config:\n      quality_model: {models[0]}\n      quality_threshold: 0.5\n"
    )
    env = {**os.environ, "TOKENMILL_SOURCE": str(source), "TOKENMILL_DATA": str(tmp_path / "data")}
    env.pop("DAGSTER_HOME", None)
    done = subprocess.run(
        [sys.executable, "-m", "cli", "update", "-c", str(tmp_path / "run.yaml")],
        env=env,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "quality_model" in done.stdout and "(dropped 30)" in done.stdout
    funnel = json.loads((tmp_path / "data" / "funnel_telemetry" / "funnel.json").read_text())
    rows = {row["stage"]: row for row in funnel["stages"]}
    assert rows["quality_model"]["docs_in"] == 60 and rows["quality_model"]["docs_out"] == 30
    assert all(row["conserved"] and row["linked"] for row in funnel["stages"])


def test_the_data_version_follows_the_model_not_the_rerun(tmp_path, models):
    """cleaned_jsonl's Dagster data version is its records' digest: a rerun keeps it (nothing downstream turns
    stale); a model retrained in place (same path and settings, other files) gives a new one, so everything
    downstream turns stale though no setting changed."""
    import shutil

    from support import materialize_batch

    from assets.clean import cleaned_jsonl
    from assets.raw import raw_records

    texts, _ = mixed(10, seed=12)
    source = tmp_path / "source"
    source.mkdir()
    (source / "mixed.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = tmp_path / "model"
    shutil.copytree(models[0], model)
    config = {"ops": {"cleaned_jsonl": {"config": {"quality_model": str(model), "quality_threshold": 0.5}}}}

    def version() -> str:
        result = materialize_batch([raw_records, cleaned_jsonl], tmp_path / "data", source, config)
        (event,) = [e for e in result.get_asset_materialization_events() if e.asset_key.path == ["cleaned_jsonl"]]
        return event.materialization.tags["dagster/data_version"]

    first = version()
    assert version() == first
    shutil.rmtree(model)
    shutil.copytree(models[1], model)
    assert version() != first
