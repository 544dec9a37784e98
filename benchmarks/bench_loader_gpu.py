"""GPU checks of tokenmill_loader (< 2 min). Without a CUDA device it says so and exits 0.

    python benchmarks/bench_loader_gpu.py [--dir /tmp/tm_bench_gpu]

1. Host-to-device copy rate, pageable vs pinned memory (a loader-sized batch and a large buffer).
2. DevicePrefetcher hides copies behind compute: per-step time of
     (a) compute only (batches already on the device),
     (b) synchronous copy then compute (no prefetch), and
     (c) DevicePrefetcher (copy of batch k+1 on a side stream during compute on batch k),
   with the copy made deliberately large (so it is visible) and compute calibrated to ~2x the copy.
   Hidden fraction = ((b) - (c)) / ((b) - (a)); ~100% means the copy is fully overlapped.
3. The real path: DataLoader(TokenDataset) -> DevicePrefetcher timed alone (best of 3 after a warm pass), beside the
   host loader alone; then 50 device batches checked equal to the host loader's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch


def cuda_time(fn, reps: int) -> float:
    """Mean seconds per call of fn, measured with CUDA events around `reps` calls."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def copy_rates(dev):
    print("== host-to-device copy rate ==")
    for label, shape in (
        ("loader batch 3x32x2048 int32 (768 KiB)", (3, 32, 2048)),
        ("large buffer 64M int32 (256 MiB)", (64, 1 << 20)),
    ):
        pageable = torch.randint(0, 50000, shape, dtype=torch.int32)
        pinned = pageable.pin_memory()
        nbytes = pageable.numel() * 4
        reps = 200 if nbytes < 1 << 24 else 10
        t_page = cuda_time(lambda src=pageable: src.to(dev), reps)
        t_pin = cuda_time(lambda src=pinned: src.to(dev, non_blocking=True), reps)
        print(
            f"  {label:40s} pageable {nbytes / t_page / 1e9:6.1f} GB/s   pinned {nbytes / t_pin / 1e9:6.1f} GB/s"
            f"   ({t_page / t_pin:.1f}x)"
        )


class HostBatches:
    """n pinned host batches (int32, like the loader's), replayed in order: isolates copy vs compute."""

    def __init__(self, n, shape):
        self.batches = [
            {
                "input_ids": torch.randint(0, 50000, shape, dtype=torch.int32).pin_memory(),
                "labels": torch.randint(0, 50000, shape, dtype=torch.int32).pin_memory(),
            }
            for _ in range(n)
        ]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def overlap(dev):
    from tokenmill_loader import DevicePrefetcher

    print("\n== DevicePrefetcher: copy hidden behind compute ==")
    shape = (256, 8192)  # 2 x 8 MiB int32 per batch: a copy long enough to measure
    host = HostBatches(8, shape)
    w = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    x = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)

    def copy_only():
        for b in host:
            for t in b.values():
                t.to(dev, non_blocking=True).long()

    t_copy = cuda_time(copy_only, 5) / len(host)
    t_mm = cuda_time(lambda: x @ w, 20)
    k = max(1, int(round(2.0 * t_copy / t_mm)))  # compute ~2x the copy

    def compute(batch):
        y = x
        for _ in range(k):
            y = y @ w
        # the batch is used by the compute (so the copy must be complete before)
        return y.sum() + batch["input_ids"][0, 0].float()

    dev_batches = [{kk: v.to(dev).long() for kk, v in b.items()} for b in host]
    steps = 5

    def run_a():
        for _ in range(steps):
            for b in dev_batches:
                compute(b)

    def run_b():
        for _ in range(steps):
            for b in host:
                compute({kk: v.to(dev).long() for kk, v in b.items()})  # synchronous copy, then compute

    def run_c():
        for _ in range(steps):
            for b in DevicePrefetcher(host, dev):
                compute(b)

    n = steps * len(host)
    ta = cuda_time(run_a, 1) / n
    tb = cuda_time(run_b, 1) / n
    tc = cuda_time(run_c, 1) / n
    print(
        f"  copy of one batch (2 x {shape[0]}x{shape[1]} int32 -> int64): {t_copy * 1e3:.2f} ms; "
        f"compute per step: {k} bf16 4096^3 matmuls"
    )
    print(f"  (a) compute only        {ta * 1e3:7.2f} ms/step")
    print(f"  (b) copy, then compute  {tb * 1e3:7.2f} ms/step")
    print(f"  (c) DevicePrefetcher    {tc * 1e3:7.2f} ms/step")
    hidden = (tb - tc) / (tb - ta) if tb > ta else float("nan")
    print(f"  copy hidden: {hidden:.0%} (100% = (c) equals compute only)")
    return hidden


def real_path(dev, root: Path):
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_loader import make_dataset

    from tokenmill_loader import DataLoader, DevicePrefetcher, TokenDataset

    print("\n== DataLoader(TokenDataset) -> DevicePrefetcher (20M tokens) ==")
    ds_path = make_dataset(root, 20_000_000)
    ds = TokenDataset(ds_path, 2048)
    steps = 300

    def timed() -> float:
        dl = DataLoader(ds, batch_size=32, seed=0)
        assert dl.pin_memory, "pin_memory should default to True with CUDA"
        torch.cuda.synchronize()
        t = time.perf_counter()
        for n, _ in enumerate(DevicePrefetcher(dl, dev), 1):
            if n == steps:
                break
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / steps

    timed()  # warm: the files' pages and the pinned-memory cache
    dt = min(timed() for _ in range(3))
    it = iter(DataLoader(ds, batch_size=32, seed=0, pin_memory=False))
    t = time.perf_counter()
    for _ in range(steps):
        next(it)
    host_dt = (time.perf_counter() - t) / steps
    checked = 0
    host = DataLoader(ds, batch_size=32, seed=0, pin_memory=False)
    for b, r in zip(DevicePrefetcher(DataLoader(ds, batch_size=32, seed=0), dev), host):
        assert b["input_ids"].is_cuda and b["input_ids"].dtype == torch.int64
        assert torch.equal(b["input_ids"].cpu(), r["input_ids"].long())
        assert torch.equal(b["labels"].cpu(), r["labels"].long())
        checked += 1
        if checked == 50:
            break
    print(
        f"  {steps} batches of 32 x 2048 on the device: {32 * 2048 / dt / 1e6:.1f} M tokens/s "
        f"({dt * 1e3:.2f} ms/batch: host read, pin, copy, upcast); the host loader alone "
        f"{32 * 2048 / host_dt / 1e6:.1f} M tokens/s ({host_dt * 1e3:.2f} ms/batch); "
        f"{checked} device batches equal to the host loader's"
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: GPU benchmarks skipped")
        return 0
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    copy_rates(dev)
    overlap(dev)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="tm_bench_gpu"))
    real_path(dev, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
