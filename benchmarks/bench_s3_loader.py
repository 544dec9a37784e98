"""Reading shards from object storage against reading the same files locally: tokenmill_loader, LitData and Mosaic
streaming, each over a real S3 server on loopback (SeaweedFS, devtools/s3_server.py) and over local files.

    python benchmarks/bench_s3_loader.py [--tokens 64_000_000] [--shard-tokens 4_000_000] [--seq-len 2048]
                                         [--batch 8] [--batches 2000] [--readers tokenmill,litdata,streaming]
                                         [--dir /tmp/tm_s3_loader]
    python benchmarks/bench_s3_loader.py --prefetch-order [--cache-fraction 0.5] [--step-ms 5] [--workers 0]

One token stream (uint16) in each reader's own format: tokenmill's tokenized_bins (uploaded by
`tokenmill.publish.publish_dataset`), LitData's chunks + index.json (TokensLoader, one item per chunk, as
bench_loader_peers.py writes them) and Mosaic streaming's MDS shards (one sample per window of L + 1 tokens, written
by its MDSWriter). Every reader shuffles, uses num_workers=0 (one process: the figures are per process) and reads
windows of L + 1 tokens, ids only (tokenmill: TokenDataset(fields=("input_ids",))).

  first batch   seconds from nothing opened (an empty cache folder for the s3 rows) to the first batch
  tokens/s      window tokens delivered per second over the rest of the epoch (--batches: that many), from s3 with
                the cache empty at the start: every shard is downloaded, checked and written while it runs
  ratio         s3 over local, per reader

--prefetch-order: tokenmill only, from s3 with a bounded cache (--cache-fraction of the split) under the shuffle, one
run each way side by side: prefetching the shards the sampler's next batches need (the DataLoader's plan) against
prefetching in stream order (what a Store read without the DataLoader does). Each batch is followed by a simulated
training step (--step-ms of sleep, as a GPU step leaves the host idle), which prefetching can overlap:

  tokens/s      window tokens per second over the run, steps included
  stall         seconds the training loop waited for its next batch (the first batch included)
  downloads     shard downloads the loader's process started (num_workers=0: all of them)

The server runs on this machine, so the network is loopback: the figures measure each reader's fetch path (requests,
checksums, cache writes), not a WAN. A reader that cannot be imported or run here is reported with the reason.
Timings on a shared machine are noisy: run twice.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.machinery
import json
import os
import shutil
import sys
import time
import traceback
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.s3_server import s3_server  # noqa: E402
from tokenmill_loader.format import (  # noqa: E402
    CURRENT_FILE,
    DATASET_FILE,
    SHARD_META_FILE,
    data_file,
    dataset_manifest,
    dumps_compact,
    key_meta,
    shard_entry,
    shard_folder_name,
    version_file,
)

SEED = 0
VOCAB = 50_000
READERS = ("tokenmill", "litdata", "streaming")
LITDATA_DTYPE_INDEX = 5  # uint16 in litdata.constants._NUMPY_SCTYPES


def _entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_corpus(base: Path, tokens: int, shard_tokens: int, seq_len: int) -> Path:
    """tokens/ (the stream), tokenized_bins/ (tokenmill, version 1), litdata/ and streaming/ (MDS) under base."""
    if (base / "complete").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    rng = np.random.default_rng(SEED)
    stream = rng.integers(3, VOCAB, size=tokens, dtype=np.uint16)
    train = base / "tokenized_bins" / "train"
    entries = []
    for index, begin in enumerate(range(0, tokens, shard_tokens)):
        ids = stream[begin : begin + shard_tokens]
        folder = train / shard_folder_name(index)
        folder.mkdir(parents=True)
        ids.tofile(folder / data_file("sequence"))
        offsets = np.append(np.arange(0, len(ids), 1000), len(ids))  # documents of 1000 tokens
        (folder / SHARD_META_FILE).write_bytes(dumps_compact({"sequence": key_meta(np.uint16, offsets)}))
        files = {name: _entry(folder / name) for name in (data_file("sequence"), SHARD_META_FILE)}
        entries.append(
            shard_entry(
                folder.name, tokens=len(ids), records=len(offsets) - 1, max_token_id=int(ids.max()), files=files
            )
        )
    manifest = dataset_manifest(
        training_type="seq",
        split="train",
        vocab_size=VOCAB,
        token_dtype="uint16",
        special_tokens={"<s>": 0, "</s>": 1, "<pad>": 2},
        keys=["sequence"],
        shards=entries,
        totals={"tokens": tokens, "records": sum(e["records"] for e in entries)},
        version={"version": 1, "generation": 1, "batches": ["g1-b0001"]},
    )
    for name in (version_file(1), DATASET_FILE):
        (train / name).write_text(json.dumps(manifest))
    (train.parent / CURRENT_FILE).write_text(json.dumps({"version": 1}))
    write_litdata(base / "litdata", stream, shard_tokens)
    write_mds(base / "streaming", stream, seq_len, shard_tokens)
    (base / "complete").write_text(json.dumps({"tokens": tokens, "shards": len(entries)}))
    return base


def write_litdata(folder: Path, stream: np.ndarray, chunk_tokens: int) -> None:
    """LitData's layout for TokensLoader: chunks of one item each (item count, byte offsets, then the tokens)."""
    folder.mkdir(parents=True)
    chunks = []
    for c, begin in enumerate(range(0, len(stream), chunk_tokens)):
        ids = stream[begin : begin + chunk_tokens]
        header = np.array([1, 12, 12 + ids.nbytes], dtype="<u4").tobytes()
        name = f"chunk-0-{c}.bin"
        (folder / name).write_bytes(header + ids.tobytes())
        chunks.append({"chunk_bytes": len(header) + ids.nbytes, "chunk_size": 1, "dim": len(ids), "filename": name})
    config = {
        "chunk_bytes": chunk_tokens * 2,
        "chunk_size": None,
        "compression": None,
        "compression_batch_size": None,
        "compression_level": None,
        "data_format": [f"no_header_numpy:{LITDATA_DTYPE_INDEX}"],
        "data_spec": json.dumps([1, {"type": None, "context": None, "children_spec": []}]),
        "encryption": None,
        "ipc_compression": None,
        "item_loader": "TokensLoader",
        "types": "json",
    }
    (folder / "index.json").write_text(json.dumps({"chunks": chunks, "config": config, "updated_at": "0"}))


def import_streaming():
    """Mosaic streaming; `import streaming` imports its vision datasets, hence torchvision, whose wheels here need
    another torch than the project's: a stand-in module suffices for token windows."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        for name in (
            "torchvision",
            "torchvision.datasets",
            "torchvision.transforms",
            "torchvision.transforms.functional",
        ):
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        sys.modules["torchvision.datasets"].CIFAR10 = object  # type: ignore[attr-defined]
        sys.modules["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
    import streaming

    return streaming


def write_mds(folder: Path, stream: np.ndarray, seq_len: int, shard_tokens: int) -> None:
    try:
        streaming = import_streaming()
    except Exception as error:
        print(f"  (no MDS shards: {type(error).__name__}: {error})")
        return
    window = seq_len + 1
    with streaming.MDSWriter(
        out=str(folder), columns={"tokens": "ndarray:uint16"}, size_limit=shard_tokens * 2, compression=None
    ) as writer:
        for begin in range(0, len(stream) - window + 1, seq_len):
            writer.write({"tokens": stream[begin : begin + window]})


def upload(server, local: Path, bucket: str) -> str:
    client = server.client()
    client.create_bucket(Bucket=bucket)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.put_object(Bucket=bucket, Key=str(path.relative_to(local)), Body=path.read_bytes())
    return f"s3://{bucket}"


# ---------------------------------------------------------------------------- the readers
def tokenmill_batches(location: str, cache: Path | None, seq_len: int, batch: int):
    from tokenmill_loader import DataLoader, TokenDataset, open_store

    store = open_store(location, cache_dir=cache) if cache is not None else open_store(location)
    ds = TokenDataset(store, seq_len=seq_len + 1, stride=seq_len, fields=("input_ids",))  # the peers' work
    for b in DataLoader(ds, batch_size=batch, seed=SEED, num_workers=0, pin_memory=False):
        yield b["input_ids"].numel()


def litdata_batches(location: str, cache: Path | None, seq_len: int, batch: int):
    import litdata.streaming.downloader
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    # its default (obstore) download path refuses a plain-http endpoint, which the loopback server is
    litdata.streaming.downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"  # type: ignore[index]

    options = {"cache_dir": str(cache)} if cache is not None else {}
    ds = StreamingDataset(
        location, item_loader=TokensLoader(block_size=seq_len + 1), shuffle=True, seed=SEED, drop_last=True, **options
    )
    for b in StreamingDataLoader(ds, batch_size=batch, num_workers=0, drop_last=True):
        yield b.numel()


def streaming_batches(location: str, cache: Path | None, seq_len: int, batch: int):
    streaming = import_streaming()
    from torch.utils.data import DataLoader

    streaming.base.util.clean_stale_shared_memory()
    if cache is None:
        ds = streaming.StreamingDataset(local=location, shuffle=True, shuffle_seed=SEED, batch_size=batch)
    else:
        ds = streaming.StreamingDataset(
            remote=location, local=str(cache), shuffle=True, shuffle_seed=SEED, batch_size=batch
        )
    for b in DataLoader(ds, batch_size=batch, num_workers=0):
        yield b["tokens"].numel()


def prefetch_order_run(remote: str, cache: Path, cache_bytes: int, args, planned: bool) -> dict:
    """One timed run of tokenmill from s3 with a bounded cache: sampler-order prefetch (planned) or stream order."""
    from tokenmill_loader import DataLoader, TokenDataset, open_store

    class StreamOrder(TokenDataset):
        shards_of = None  # no shard map: the DataLoader makes no plan, the Store prefetches in stream order

    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    store = open_store(remote, cache_dir=cache, cache_bytes=cache_bytes)
    kind = TokenDataset if planned else StreamOrder
    ds = kind(store, seq_len=args.seq_len + 1, stride=args.seq_len, fields=("input_ids",))
    loader = DataLoader(ds, batch_size=args.batch, seed=SEED, num_workers=args.workers, pin_memory=False)
    it, tokens, stall, n = iter(loader), 0, 0.0, 0
    while n < (args.batches or len(loader)):
        t = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            break
        stall += time.perf_counter() - t
        tokens += batch["input_ids"].numel()
        n += 1
        time.sleep(args.step_ms / 1000)  # the training step
    seconds = time.perf_counter() - t0
    downloads = len(store._remote.started)
    return {
        "tokens_per_s": tokens / seconds,
        "stall_s": stall,
        "seconds": seconds,
        "batches": n,
        "downloads": downloads,
    }


def compare_prefetch_order(args, base: Path) -> None:
    split = base / "tokenized_bins" / "train"
    split_bytes = sum(p.stat().st_size for p in split.rglob("*.bin"))
    cache_bytes = int(split_bytes * args.cache_fraction)
    timed = f"{args.batches} batches" if args.batches else "one epoch"
    print(
        f"\nL = {args.seq_len}, batch {args.batch}, shuffled, num_workers={args.workers}, {timed}, "
        f"a {args.step_ms:g} ms step per batch; cache bound {cache_bytes / 2**20:.0f} MiB "
        f"({args.cache_fraction:.0%} of the split)"
    )
    print(f"{'prefetch':<16} {'tokens/s':>14} {'stall':>9} {'seconds':>9} {'downloads':>10}")
    rows = {}
    for name, planned in (("sampler order", True), ("stream order", False)):
        cache = args.dir / "cache-order"
        r = rows[name] = prefetch_order_run("s3://tokenmill/corpus/train", cache, cache_bytes, args, planned)
        print(
            f"{name:<16} {r['tokens_per_s']:>14,.0f} {r['stall_s']:>7.2f} s {r['seconds']:>7.2f} s {r['downloads']:>10}"
        )
    ours, theirs = rows["sampler order"], rows["stream order"]
    print(
        f"sampler order: tokens/s x{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f} stream order's, "
        f"stall {ours['stall_s']:.2f} s against {theirs['stall_s']:.2f} s"
    )


BATCHES = {"tokenmill": tokenmill_batches, "litdata": litdata_batches, "streaming": streaming_batches}
IMPORTS = {"tokenmill": "tokenmill_loader.loader", "litdata": "litdata", "streaming": None}  # None: import_streaming


def measure(reader: str, location: str, cache: Path | None, seq_len: int, batch: int, batches: int) -> dict:
    # imports (torch's among them) are no part of a first batch: every reader pays them once per process
    importlib.import_module(IMPORTS[reader]) if IMPORTS[reader] else import_streaming()
    t0 = time.perf_counter()
    it = BATCHES[reader](location, cache, seq_len, batch)
    next(it)
    first = time.perf_counter() - t0
    tokens, n, t1 = 0, 0, time.perf_counter()
    for tokens_in_batch in it:
        tokens += tokens_in_batch
        n += 1
        if n == batches:  # never, with 0: the whole epoch
            break
    seconds = time.perf_counter() - t1
    return {"first_s": first, "tokens_per_s": tokens / seconds if seconds else float("nan"), "batches": n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64_000_000)
    parser.add_argument("--shard-tokens", type=int, default=4_000_000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batches", type=int, default=0, help="batches timed after the first (0: the epoch's rest)")
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--dir", type=Path, default=Path("/tmp/tm_s3_loader"))
    parser.add_argument("--prefetch-order", action="store_true", help="sampler-order against stream-order prefetch")
    parser.add_argument("--cache-fraction", type=float, default=0.5, help="--prefetch-order: the cache bound")
    parser.add_argument("--step-ms", type=float, default=5.0, help="--prefetch-order: simulated step per batch")
    parser.add_argument("--workers", type=int, default=0, help="--prefetch-order: DataLoader num_workers")
    args = parser.parse_args()
    base = args.dir / f"corpus-{args.tokens}-{args.shard_tokens}-{args.seq_len}"
    t = time.perf_counter()
    write_corpus(base, args.tokens, args.shard_tokens, args.seq_len)
    print(f"corpus: {args.tokens:,} uint16 tokens, shards of {args.shard_tokens:,} ({time.perf_counter() - t:.1f} s)")
    shutil.rmtree(args.dir / "server", ignore_errors=True)  # a fresh bucket per run
    with s3_server(args.dir / "server") as server:
        os.environ.update(server.env)
        os.environ["S3_ENDPOINT_URL"] = server.endpoint  # Mosaic streaming's name for it
        from tokenmill.publish import publish_dataset

        server.make_bucket("tokenmill")
        t = time.perf_counter()
        result = publish_dataset(base / "tokenized_bins", "s3://tokenmill/corpus")
        print(f"tokenmill publish: {result.uploaded} objects, {result.uploaded_bytes / 2**20:.0f} MiB in "
              f"{time.perf_counter() - t:.1f} s")  # fmt: skip
        if args.prefetch_order:
            compare_prefetch_order(args, base)
            return
        places = {
            "tokenmill": (str(base / "tokenized_bins" / "train"), "s3://tokenmill/corpus/train"),
            "litdata": (str(base / "litdata"), None),
            "streaming": (str(base / "streaming"), None),
        }
        rows = []
        timed = f"{args.batches} batches" if args.batches else "one epoch"
        print(f"\nL = {args.seq_len}, batch {args.batch}, shuffled, num_workers=0, {timed} timed")
        print(f"{'reader':<10} {'from':<6} {'first batch':>12} {'tokens/s':>14}   s3 / local")
        for reader in args.readers.split(","):
            local, remote = places[reader]
            try:
                if remote is None:
                    if not Path(local).exists():
                        raise RuntimeError(f"no {reader} files were written")
                    remote = upload(server, Path(local), reader)
                cache = args.dir / f"cache-{reader}"
                shutil.rmtree(cache, ignore_errors=True)
                here = measure(reader, local, None, args.seq_len, args.batch, args.batches)
                there = measure(reader, remote, cache, args.seq_len, args.batch, args.batches)
            except Exception as error:
                print(f"{reader:<10} could not run here: {type(error).__name__}: {str(error)[:300]}")
                traceback.print_exc(limit=3, file=sys.stderr)
                continue
            for name, r in (("local", here), ("s3", there)):
                print(f"{reader:<10} {name:<6} {r['first_s'] * 1000:>9.1f} ms {r['tokens_per_s']:>14,.0f}", end="")
                if name == "s3":
                    print(f"   first batch x{there['first_s'] / here['first_s']:.1f}, "
                          f"tokens/s x{there['tokens_per_s'] / here['tokens_per_s']:.2f}", end="")  # fmt: skip
                print()
            rows.append((reader, here, there))
        if len(rows) > 1 and rows[0][0] == "tokenmill":
            ours = rows[0][2]
            for reader, _, there in rows[1:]:
                print(
                    f"from s3: tokenmill {ours['tokens_per_s'] / there['tokens_per_s']:.2f}x {reader}'s tokens/s; "
                    f"first batch {ours['first_s'] * 1000:.0f} ms against {there['first_s'] * 1000:.0f} ms"
                )


if __name__ == "__main__":
    main()
