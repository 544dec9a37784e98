"""Resume in a fresh process after K batches (K = 0, 1, mid-epoch, last, end of epoch) with 0 and 2
workers gives bit-identical next batches to an uninterrupted run: DataLoader, PackingLoader, MixedLoader.
One subprocess per loader kind runs every (K, workers) case, each with a freshly built loader."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from resume_child import build
from tm_writer import random_docs, write_dataset

HERE = Path(__file__).parent
NEXT = 5  # batches compared after each resume point


def run_with_states(loader, n):
    """n batches of an uninterrupted run, and the state after each prefix (states[k]: after k batches)."""
    batches, states = [], [loader.state_dict()]
    empty = 0
    while len(batches) < n and empty < 2:
        got = False
        for b in loader:
            got = True
            batches.append(b)
            states.append(json.loads(json.dumps(loader.state_dict())))
            if len(batches) == n:
                break
        empty = 0 if got else empty + 1
    return batches, states


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def epoch_end(states, kind) -> int:
    """Batches in the first epoch (of the first inner loader for mixed)."""
    for k, s in enumerate(states):
        st = s["inner"]["windows"] if kind == "mixed" else s
        if st["epoch"] == 1:
            return k
    raise AssertionError("no epoch end in the reference run")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    recs = random_docs(24, seed=8, masked=True, max_len=36)
    return {"sft": str(write_dataset(root / "sft", recs, "sft", shard_records=7))}


@pytest.mark.parametrize("kind", ["dataloader", "packing", "mixed"])
def test_resume_in_fresh_process(kind, paths, tmp_path):
    total = 90
    ref, states = run_with_states(build(kind, paths, 0), total)
    nb = epoch_end(states, kind)
    assert 4 <= nb and nb + NEXT <= len(ref)
    # the same run with 2 workers: identical batches, identical consumed-state after every batch
    ref2, states2 = run_with_states(build(kind, paths, 2), nb + NEXT + 1)
    assert same(ref2, ref[: len(ref2)])
    assert states2 == states[: len(states2)]
    ks = sorted({0, 1, nb // 2, nb - 1, nb})
    cases = [{"workers": w, "state": states[k], "take": NEXT, "k": k} for k in ks for w in (0, 2)]
    spec = tmp_path / "spec.json"
    out = tmp_path / "out.pt"
    spec.write_text(json.dumps({"kind": kind, "paths": paths, "cases": cases, "out": str(out)}))
    proc = subprocess.run(
        [sys.executable, str(HERE / "resume_child.py"), str(spec)], capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(out, weights_only=False)
    for case, batches in zip(cases, got):
        k = case["k"]
        assert same(batches, ref[k : k + NEXT]), f"{kind}: resume after {k} batches, {case['workers']} workers"
