"""Builds the loaders of the resume tests; run as a script it resumes them in a fresh process.

    python resume_child.py SPEC.json   # SPEC: {kind, paths, cases: [{workers, state, take}], out}
Writes torch.save(list of batch lists) to SPEC["out"].
"""

from __future__ import annotations

import json
import sys

import torch

from tokenmill_loader import DataLoader, MixedLoader, PackingLoader, RecordDataset, TokenDataset


def build(kind: str, paths: dict, workers: int):
    def dataloader():
        return DataLoader(
            TokenDataset(paths["sft"], 12, stride=5),
            batch_size=4,
            shuffle=True,
            seed=3,
            num_workers=workers,
            pin_memory=False,
        )

    def packing():
        return PackingLoader(
            RecordDataset(paths["sft"]),
            max_tokens=48,
            pool_size=4,
            max_batch_size=3,
            long_threshold=30,
            seed=5,
            num_workers=workers,
            read_chunk=3,
            pin_memory=False,
        )

    if kind == "dataloader":
        return dataloader()
    if kind == "packing":
        return packing()
    if kind == "mixed":
        return MixedLoader({"windows": dataloader(), "packed": packing()}, {"windows": 2, "packed": 1}, seed=7)
    raise ValueError(kind)


def take(loader, n: int) -> list:
    """The next n batches, crossing epoch ends (a new iter() starts the next epoch)."""
    out = []
    empty = 0
    while len(out) < n and empty < 2:
        got = False
        it = iter(loader)
        for b in it:
            got = True
            out.append(b)
            if len(out) == n:
                break
        if hasattr(it, "close"):
            it.close()
        empty = 0 if got else empty + 1
    return out


def main(spec_path: str) -> None:
    spec = json.loads(open(spec_path).read())
    results = []
    for case in spec["cases"]:
        ld = build(spec["kind"], spec["paths"], case["workers"])
        ld.load_state_dict(case["state"])
        results.append(take(ld, case["take"]))
    torch.save(results, spec["out"])


if __name__ == "__main__":
    main(sys.argv[1])
