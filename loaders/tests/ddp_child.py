"""One rank of the DDP test: the README's DataLoader call in an epoch loop with an all_reduce per batch.

    RANK=r WORLD_SIZE=w MASTER_ADDR=127.0.0.1 MASTER_PORT=p python ddp_child.py OUT.json DATASET...
Writes {dataset: [[window ids of each batch] per epoch]} to OUT.json (the window id is input_ids[:, 0] // SEQ_LEN:
the test datasets hold the tokens 0, 1, 2, ...).
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from tokenmill_loader import DataLoader, TokenDataset

SEQ_LEN = 4
EPOCHS = 2


def main(out: str, paths: list[str]) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # a collective waiting for a rank that has left its loop fails after the timeout instead of hanging
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=20))
    seen = {}
    for path in paths:
        ds = TokenDataset(path, seq_len=SEQ_LEN)
        loader = DataLoader(ds, batch_size=32, seed=0, rank=rank, world_size=world)
        seen[path] = []
        for epoch in range(EPOCHS):
            loader.set_epoch(epoch)
            batches = []
            for batch in loader:
                loss = torch.ones(1)
                dist.all_reduce(loss)  # stands in for DDP's gradient all_reduce
                batches.append((batch["input_ids"][:, 0] // SEQ_LEN).tolist())
            seen[path].append(batches)
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
