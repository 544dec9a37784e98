"""Data parallelism: real gloo ranks running the README's loop to the end of every epoch, and resume across a
change of world size or worker count (every sample of the epoch exactly once)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from ddp_child import EPOCHS, SEQ_LEN
from tm_writer import write_dataset

from tokenmill_loader import DataLoader, ResumableSampler

HERE = Path(__file__).parent


def counting_dataset(root: Path, windows: int) -> Path:
    """A seq dataset holding the tokens 0, 1, 2, ...: window i starts with token i * SEQ_LEN."""
    tokens = np.arange(windows * SEQ_LEN).tolist()
    docs = [{"sequence": tokens[i : i + 50]} for i in range(0, len(tokens), 50)]
    return write_dataset(root, docs, "seq", shard_records=40, vocab_size=1 << 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_ranks_get_equal_batches_and_never_hang(tmp_path):
    """6721 windows on 2 ranks: 3361 vs 3360 samples were 106 vs 105 batches of 32, and rank 0's last all_reduce
    waited forever. Now both ranks run 105 batches (the last partial) and the odd window out differs by epoch."""
    world = 2
    sizes = {6721: 105, 65: 1}  # windows: batches per rank
    paths = {n: str(counting_dataset(tmp_path / f"w{n}", n)) for n in sizes}
    port = free_port()
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "ddp_child.py"), str(tmp_path / f"r{rank}.json"), *paths.values()],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 60
    try:
        for p in procs:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        pytest.fail("a rank hung in the epoch loop")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p in procs:
        assert p.returncode == 0, p.stderr.read()[-3000:]
    seen = [json.loads((tmp_path / f"r{rank}.json").read_text()) for rank in range(world)]
    for n, per_rank in sizes.items():
        for epoch in range(EPOCHS):
            batches = [s[paths[n]][epoch] for s in seen]
            assert [len(b) for b in batches] == [per_rank] * world
            ids = [i for b in batches for batch in b for i in batch]
            assert len(ids) == len(set(ids)) == n - n % world  # disjoint; only n % world left out


class Indices(torch.utils.data.Dataset):
    """Item i is i: batches are the sample ids."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i


def lockstep(world: int, workers: int, state: dict | None, batches: int | None, n: int, batch_size: int):
    """`world` ranks stepping together through up to `batches` batches (None: to the end of the epoch).
    Returns the sample ids seen and each rank's state afterwards."""
    loaders = [
        DataLoader(Indices(n), batch_size=batch_size, seed=7, rank=r, world_size=world, num_workers=workers)
        for r in range(world)
    ]
    for ld in loaders:
        if state is not None:
            ld.load_state_dict(state)
    assert len({len(ld) for ld in loaders}) == 1  # the same number of batches left on every rank
    its = [iter(ld) for ld in loaders]
    ids, steps = [], 0
    while batches is None or steps < batches:
        step = [next(it, None) for it in its]
        if all(b is None for b in step):
            break
        assert all(b is not None for b in step), "ranks ran out at different batches"
        ids.extend(i for b in step for i in b.tolist())
        steps += 1
    for it in its:
        if hasattr(it, "close"):
            it.close()
    return ids, [ld.state_dict() for ld in loaders]


@pytest.mark.parametrize(
    "plan",
    [
        [(2, 0, 5), (3, 2, None)],  # 2 ranks -> 3 ranks, 0 -> 2 workers
        [(2, 2, 7), (1, 0, None)],  # 2 ranks -> 1 rank, 2 -> 0 workers
        [(2, 0, 3), (3, 0, 2), (1, 2, None)],  # resumed twice
        [(3, 0, 1), (2, 0, None)],
    ],
)
def test_resume_across_world_size_and_workers(plan):
    """Each new rank loads the state saved by some old rank (all old ranks saved the same state) with its own
    rank and world_size; the epoch's remaining samples are each seen once, none skipped, and only the last
    remaining % world of the order are left out (as in any epoch under that world size)."""
    n, bs, epoch = 101, 4, 1
    state = {**ResumableSampler(n, seed=7).state_dict(), "epoch": epoch, "position": 0}
    seen = []
    for world, workers, batches in plan:
        start = state["position"]
        ids, states = lockstep(world, workers, state, batches, n, bs)
        assert all(s == states[0] for s in states)  # any rank's state will do
        seen.extend(ids)
        state = states[-1]
        if batches is not None:
            assert state == {**state, "epoch": epoch, "position": start + batches * bs * world}
    order = ResumableSampler(n, seed=7).permutation(epoch).tolist()
    last_world = plan[-1][0]
    before_last = n - sum(b * bs * w for w, _, b in plan[:-1])
    assert len(seen) == len(set(seen))
    assert seen and sorted(seen) == sorted(order[: n - before_last % last_world])
    assert state["epoch"] == epoch + 1 and state["position"] == 0
    # the next epoch is the plain one of the new world size
    nxt, _ = lockstep(last_world, 0, state, None, n, bs)
    assert sorted(nxt) == sorted(ResumableSampler(n, seed=7).permutation(epoch + 1)[: n - n % last_world].tolist())


def test_state_is_in_samples_and_rank_independent():
    """position counts samples of the epoch's order consumed by all ranks (batch size may change at resume);
    a 0.1 state (per-rank position, with rank and world_size) is read as position * world_size."""
    a = ResumableSampler(100, batch_size=3, seed=1, rank=0, world_size=2)
    b = ResumableSampler(100, batch_size=3, seed=1, rank=1, world_size=2)
    for s in (a, b):
        s.advance(6)
    assert a.state_dict() == b.state_dict() and a.state_dict()["position"] == 12
    r = ResumableSampler(100, batch_size=5, seed=1, rank=0, world_size=1)
    r.load_state_dict(
        {"epoch": 0, "position": 6, "seed": 1, "shuffle": True, "length": 100, "rank": 1, "world_size": 2}
    )
    assert list(r) == a.permutation(0)[12:].tolist()
