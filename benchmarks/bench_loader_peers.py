"""tokenmill_loader against Megatron-Core, OLMo-core and LitData on the same tokens (CPU, one process each).

    python benchmarks/bench_loader_peers.py [--tokens 100_000_000] [--large-tokens 10_000_000_000]
                                            [--peers tokenmill,tokenmill_input_ids,megatron,olmo,litdata]
                                            [--dir /tmp/tm_loader_peers]

For uint16 and uint32 tokens, sequence length 2048 and 8192, batch 8 and 32, shuffled, every reader in its own
process (num_workers=0, so "per process" is what it says):

  first batch   seconds from nothing built to the first batch: opening the files and every index the reader
                builds (Megatron-Core: document, sample and shuffle indices; OLMo-core: its global indices; LitData:
                its chunk intervals; caches removed first)
  tokens/s      input tokens delivered per second after the first batch (CPU seconds per 1M tokens beside it)
  peak memory   the process's peak RSS above what it held after its imports (mapped pages it read included)
  resume        after 10M tokens: the reader's state (Megatron-Core: consumed samples) into a new loader over the
                opened data, to the first batch; `reopen` also opens the data again (index caches kept), as a
                restarted job does. Each resumed batch is compared with the batch the first run gave there.

A first-batch-only pass runs at --large-tokens (default 10B) on generated sparse files (zeros: no disk, no data),
where only what the readers build up front grows. --tokens above --sparse-above are sparse too (flag for 1B/10B).

The same token stream in every reader's own format, written by this script: tokenmill's split folder
(docs/format.md, 1B-token shards), Megatron-Core's .bin/.idx (IndexedDataset format; its dtype codes have no
uint32, so uint32 data is declared int32: the same bytes for ids < 2**31), OLMo-core's raw token arrays (the shard
files themselves) and LitData's chunks + index.json (the layout litdata.optimize writes with TokensLoader, one item
per chunk). Windows: tokenmill seq_len L + 1, stride L (input_ids, labels, position_ids; tokenmill_input_ids:
input_ids only, TokenDataset(fields=("input_ids",)), the work OLMo-core and LitData do); Megatron-Core L tokens +
its extra label token (tokens, labels, loss_mask, position_ids; no attention mask); OLMo-core L tokens
(input_ids); LitData blocks of L + 1. Each row gives both tokenmill readers' rate over its own.
A peer that cannot be imported or run here is reported with the reason.
Timings on a shared machine are noisy: the CPU seconds are the steadier figure.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEQ_LENS = (2048, 8192)
BATCHES = (8, 32)
DTYPES = ("uint16", "uint32")
PEERS = ("tokenmill", "tokenmill_input_ids", "megatron", "olmo", "litdata")
TOKENMILL_READERS = ("tokenmill", "tokenmill_input_ids")  # the ratio columns: each over every reader
VOCAB = {"uint16": 50_304, "uint32": 200_064}  # GPT-NeoX-like / o200k-like vocabularies
EOS, PAD = 1, 2
SHARD_TOKENS = 1_000_000_000  # tokenmill shards and OLMo-core arrays: files of up to 1B tokens
LITDATA_CHUNK_BYTES = 256 << 20  # well under LitData's 4 GiB chunk limit (uint32 offsets)
RESUME_TOKENS = 10_000_000
MIN_MEASURE_S = 2.0  # tokens/s over at least this long (and at least RESUME_TOKENS)
SEED = 0
MEGATRON_DTYPE_CODE = {"uint16": 8, "uint32": 4}  # its DType enum: uint16 = 8, int32 = 4 (no uint32)
LITDATA_DTYPE_INDEX = {"uint16": 5, "uint32": 6}  # litdata.constants._NUMPY_SCTYPES positions


# ---------------------------------------------------------------------------- the corpus in four formats
def doc_lengths(total: int, seed: int = SEED) -> np.ndarray:
    """Document lengths summing to `total`: lognormal, median ~600 tokens, mean ~1000, 16..65536."""
    rng = np.random.default_rng(seed)
    out, have = [], 0
    while have < total:
        n = max(1024, (total - have) // 900)
        lens = np.clip(rng.lognormal(6.4, 1.0, size=n), 16, 65536).astype(np.int64)
        out.append(lens)
        have += int(lens.sum())
    lens = np.concatenate(out)
    cum = np.cumsum(lens)
    k = int(np.searchsorted(cum, total))
    lens = lens[: k + 1]
    lens[-1] -= int(cum[k] - total)
    return lens[lens > 0]


def write_tokens(path: Path, n: int, dtype: str, lens: np.ndarray, first: int, sparse: bool, seed: int) -> None:
    """n tokens of documents lens[first:...] (random ids, EOS last in each), or a sparse file of zeros."""
    with open(path, "wb") as f:
        if sparse:
            f.truncate(n * np.dtype(dtype).itemsize)
            return
        rng = np.random.default_rng(seed)
        step = 1 << 26
        ends = np.cumsum(lens[first:])
        for a in range(0, n, step):
            b = min(n, a + step)
            toks = rng.integers(3, VOCAB[dtype], size=b - a, dtype=np.int64).astype(dtype)
            e = ends[(ends > a) & (ends <= b)] - 1 - a
            toks[e] = EOS
            toks.tofile(f)


def build_corpus(root: Path, dtype: str, total: int, sparse: bool) -> Path:
    """The token stream of `total` tokens as tokenmill shards (also OLMo-core's arrays), Megatron-Core's
    .bin/.idx and LitData chunks, under root/<dtype>-<total>[-sparse]; reused when complete."""
    sys.path.insert(0, str(ROOT / "loaders"))
    from tokenmill_loader.format import (
        DATASET_FILE,
        SHARD_META_FILE,
        data_file,
        dataset_manifest,
        dumps_compact,
        key_meta,
        shard_entry,
        shard_folder_name,
    )

    base = root / f"{dtype}-{total}{'-sparse' if sparse else ''}"
    if (base / "complete").exists():
        return base
    shutil.rmtree(base, ignore_errors=True)
    t = time.perf_counter()
    lens = doc_lengths(total)
    cum = np.concatenate([[0], np.cumsum(lens)])
    item = np.dtype(dtype).itemsize
    # tokenmill: shards of whole documents, up to SHARD_TOKENS each
    tm = base / "tokenmill"
    tm.mkdir(parents=True)
    cuts = [0]
    while cum[cuts[-1]] < total:
        cuts.append(int(np.searchsorted(cum, cum[cuts[-1]] + SHARD_TOKENS, "right")) - 1)
        if cuts[-1] == cuts[-2]:  # a document longer than a shard
            cuts[-1] += 1
    entries = []
    for s, (a, b) in enumerate(zip(cuts, cuts[1:])):
        folder = tm / shard_folder_name(s)
        folder.mkdir()
        n = int(cum[b] - cum[a])
        write_tokens(folder / data_file("sequence"), n, dtype, lens, a, sparse, seed=s)
        offsets = cum[a : b + 1] - cum[a]
        (folder / SHARD_META_FILE).write_bytes(dumps_compact({"sequence": key_meta(dtype, offsets)}))
        files = {f: {"bytes": (folder / f).stat().st_size} for f in (data_file("sequence"), SHARD_META_FILE)}
        top = VOCAB[dtype] - 1
        entries.append(shard_entry(shard_folder_name(s), tokens=n, records=b - a, max_token_id=top, files=files))
    info = dataset_manifest(
        training_type="seq",
        split="train",
        vocab_size=VOCAB[dtype],
        token_dtype=dtype,
        special_tokens={"<s>": 0, "</s>": EOS, "<pad>": PAD},
        shards=entries,
        totals={"tokens": total, "records": len(lens)},
    )
    (tm / DATASET_FILE).write_bytes(dumps_compact(info))
    shards = [tm / e["name"] / data_file("sequence") for e in entries]
    # Megatron-Core: one .bin (the shards' bytes, concatenated) and its .idx (one sequence per document)
    mg = base / "megatron"
    mg.mkdir()
    if len(shards) == 1:
        os.link(shards[0], mg / "tokens.bin")
    else:
        with open(mg / "tokens.bin", "wb") as out:
            if sparse:
                out.truncate(total * item)
            else:
                for p in shards:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 24)
    with open(mg / "tokens.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(np.array([1], "<u8").tobytes())
        f.write(np.array([MEGATRON_DTYPE_CODE[dtype]], "u1").tobytes())
        f.write(np.array([len(lens), len(lens) + 1], "<u8").tobytes())
        f.write(lens.astype("<i4").tobytes())
        f.write((cum[:-1] * item).astype("<i8").tobytes())
        f.write(np.arange(len(lens) + 1, dtype="<i8").tobytes())
    # LitData: chunks of one item each (header: item count, then byte offsets of the item; then the tokens)
    lit = base / "litdata"
    lit.mkdir()
    per_chunk = LITDATA_CHUNK_BYTES // item
    chunks = []
    stream = np.memmap(mg / "tokens.bin", dtype=dtype, mode="r") if not sparse else None
    for c, a in enumerate(range(0, total, per_chunk)):
        n = min(per_chunk, total - a)
        name = f"chunk-0-{c}.bin"
        header = np.array([1, 12, 12 + n * item], dtype="<u4").tobytes()
        with open(lit / name, "wb") as f:
            f.write(header)
            if sparse:
                f.truncate(len(header) + n * item)
            else:
                f.write(np.ascontiguousarray(stream[a : a + n]).tobytes())
        chunks.append({"chunk_bytes": len(header) + n * item, "chunk_size": 1, "dim": n, "filename": name})
    del stream
    config = {
        "chunk_bytes": LITDATA_CHUNK_BYTES,
        "chunk_size": None,
        "compression": None,
        "compression_batch_size": None,
        "compression_level": None,
        "data_format": [f"no_header_numpy:{LITDATA_DTYPE_INDEX[dtype]}"],
        "data_spec": json.dumps([1, {"type": None, "context": None, "children_spec": []}]),
        "encryption": None,
        "ipc_compression": None,
        "item_loader": "TokensLoader",
        "types": "json",
    }
    (lit / "index.json").write_text(json.dumps({"chunks": chunks, "config": config, "updated_at": "0"}))
    (base / "complete").write_text(json.dumps({"tokens": total, "documents": len(lens), "shards": len(shards)}))
    print(
        f"  wrote {base.name}: {total:,} tokens, {len(lens):,} documents, {len(shards)} shards, "
        f"{len(chunks)} LitData chunks in {time.perf_counter() - t:.1f} s",
        flush=True,
    )
    return base


# ---------------------------------------------------------------------------- the readers
# Each reader: open(corpus, seq_len, batch) -> (handle, iterator of batches); state(handle, batches_done);
# resume(handle, state, reopen) -> iterator; ids(batch) -> the (B, L) token ids, for comparing batches.
class Tokenmill:
    fields = ("input_ids", "labels", "position_ids")

    def open(self, corpus: Path, seq_len: int, batch: int):
        from tokenmill_loader import DataLoader, TokenDataset

        ds = TokenDataset(corpus / "tokenmill", seq_len=seq_len + 1, stride=seq_len, fields=self.fields)
        dl = DataLoader(ds, batch_size=batch, shuffle=True, seed=SEED, compact_labels=True)
        return {"args": (corpus, seq_len, batch), "ds": ds, "dl": dl}, iter(dl)

    def state(self, h, done: int):
        return h["dl"].state_dict()

    def resume(self, h, state, reopen: bool):
        from tokenmill_loader import DataLoader, TokenDataset

        corpus, seq_len, batch = h["args"]
        ds = (
            TokenDataset(corpus / "tokenmill", seq_len=seq_len + 1, stride=seq_len, fields=self.fields)
            if reopen
            else h["ds"]
        )
        dl = DataLoader(ds, batch_size=batch, shuffle=True, seed=SEED, compact_labels=True)
        dl.load_state_dict(state)
        return iter(dl)

    @staticmethod
    def ids(b):
        return b["input_ids"]


class TokenmillInputIds(Tokenmill):
    """The tokens only, as a trainer that shifts them itself asks for them."""

    fields = ("input_ids",)


class Megatron:
    """GPTDataset (shuffled document, sample and shuffle indices, cached under the corpus) through a torch
    DataLoader in order from a consumed-samples offset, as Megatron's pretraining sampler does."""

    def _dataset(self, corpus: Path, seq_len: int, dtype: str):
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

        class Tok:  # what GPTDataset asks of a tokenizer
            vocab_size = VOCAB[dtype]
            eod = EOS
            pad = PAD
            unique_identifiers = {"class": "Tok", "vocab_size": VOCAB[dtype]}  # part of the index cache's key

        config = GPTDatasetConfig(
            random_seed=SEED,
            sequence_length=seq_len,
            blend=([str(corpus / "megatron" / "tokens")], None),
            split="100,0,0",
            path_to_cache=str(corpus / "megatron" / f"cache-{seq_len}"),
            tokenizer=Tok(),
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=False,
            create_attention_mask=False,
            mmap_bin_files=True,
        )
        samples = json.loads((corpus / "complete").read_text())["tokens"] // seq_len
        (train, _, _) = BlendedMegatronDatasetBuilder(GPTDataset, [samples, 0, 0], lambda: True, config).build()
        return train

    def _loader(self, ds, batch: int, start: int):
        import torch

        order = range(start, len(ds) - len(ds) % batch)
        sampler = [list(order[i : i + batch]) for i in range(0, len(order), batch)]
        return iter(torch.utils.data.DataLoader(ds, batch_sampler=sampler, num_workers=0))

    def open(self, corpus: Path, seq_len: int, batch: int):
        dtype = corpus.name.split("-")[0]
        shutil.rmtree(corpus / "megatron" / f"cache-{seq_len}", ignore_errors=True)
        ds = self._dataset(corpus, seq_len, dtype)
        return {"args": (corpus, seq_len, batch, dtype), "ds": ds}, self._loader(ds, batch, 0)

    def state(self, h, done: int):
        return {"consumed_samples": done * h["args"][2]}

    def resume(self, h, state, reopen: bool):
        corpus, seq_len, batch, dtype = h["args"]
        ds = self._dataset(corpus, seq_len, dtype) if reopen else h["ds"]
        return self._loader(ds, batch, state["consumed_samples"])

    @staticmethod
    def ids(b):
        return b["tokens"]


class Olmo:
    """NumpyFSLDataset over the shard files (raw token arrays) and its NumpyFSLDataLoader (global indices
    shuffled per epoch and saved in a work dir)."""

    def _loader(self, h, reopen: bool):
        from olmo_core.data import NumpyDataLoaderConfig, NumpyFSLDataset

        corpus, seq_len, batch, dtype = h["args"]
        ds = h.get("ds")
        if ds is None or reopen:
            paths = sorted(str(p) for p in (corpus / "tokenmill").glob("shard-*/sequence.bin"))
            ds = NumpyFSLDataset(
                *paths,
                sequence_length=seq_len,
                pad_token_id=PAD,
                eos_token_id=EOS,
                vocab_size=VOCAB[dtype],
                dtype=np.dtype(dtype).type,
            )
            h["ds"] = ds
        config = NumpyDataLoaderConfig(global_batch_size=batch * seq_len, seed=SEED, work_dir=h["work"], num_workers=0)
        return config.build(ds)

    def open(self, corpus: Path, seq_len: int, batch: int):
        dtype = corpus.name.split("-")[0]
        work = corpus / "olmo-work"
        shutil.rmtree(work, ignore_errors=True)
        h = {"args": (corpus, seq_len, batch, dtype), "work": str(work)}
        dl = self._loader(h, reopen=True)
        dl.reshuffle(epoch=1)
        h["dl"] = dl
        return h, iter(dl)

    def state(self, h, done: int):
        return h["dl"].state_dict()

    def resume(self, h, state, reopen: bool):
        dl = self._loader(h, reopen)
        dl.load_state_dict(state)
        dl.reshuffle(epoch=state.get("epoch", 1))
        return iter(dl)

    @staticmethod
    def ids(b):
        return b["input_ids"]


class Litdata:
    """StreamingDataset over the chunks with TokensLoader(block_size=L + 1), shuffled, and its
    StreamingDataLoader (state_dict / load_state_dict)."""

    def _loader(self, h):
        from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

        corpus, seq_len, batch = h["args"]
        ds = StreamingDataset(
            str(corpus / "litdata"),
            item_loader=TokensLoader(block_size=seq_len + 1),
            shuffle=True,
            seed=SEED,
            drop_last=True,
        )
        return StreamingDataLoader(ds, batch_size=batch, num_workers=0, drop_last=True)

    def open(self, corpus: Path, seq_len: int, batch: int):
        h = {"args": (corpus, seq_len, batch)}
        h["dl"] = self._loader(h)
        return h, iter(h["dl"])

    def state(self, h, done: int):
        return h["dl"].state_dict()

    def resume(self, h, state, reopen: bool):
        dl = self._loader(h)  # a StreamingDataset is bound to its loader's iteration: a new one either way
        dl.load_state_dict(state)
        return iter(dl)

    @staticmethod
    def ids(b):
        return b


READERS = {
    "tokenmill": Tokenmill,
    "tokenmill_input_ids": TokenmillInputIds,
    "megatron": Megatron,
    "olmo": Olmo,
    "litdata": Litdata,
}
IMPORTS = {
    "tokenmill": "tokenmill_loader.datasets",
    "tokenmill_input_ids": "tokenmill_loader.datasets",
    "megatron": "megatron.core.datasets.gpt_dataset",
    "olmo": "olmo_core.data",
    "litdata": "litdata",
}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def child(peer: str, corpus: Path, seq_len: int, batch: int, first_only: bool) -> dict:
    """One measurement in this process; a dict of figures, or {"error": why}."""
    import importlib

    try:
        importlib.import_module(IMPORTS[peer])
        import torch

        torch.set_num_threads(1)  # one process, one core: the readers' own work, not intra-op threads
    except Exception as e:  # a peer missing or broken here: say why and go on
        return {"error": f"import {IMPORTS[peer]}: {type(e).__name__}: {e}"[:300]}
    reader = READERS[peer]()
    base = rss_mb()
    out = {}
    try:
        t = time.perf_counter()
        h, it = reader.open(corpus, seq_len, batch)
        first = reader.ids(next(it))
        out["first_batch_s"] = time.perf_counter() - t
        assert tuple(first.shape) in ((batch, seq_len), (batch, seq_len + 1)), tuple(first.shape)
        if first_only:
            out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
            return out
        per_batch = batch * seq_len
        resume_at = -(-RESUME_TOKENS // per_batch)  # batches consumed before the state is taken
        done, state, expect = 1, None, None
        c0, t0 = os.times(), time.perf_counter()
        for b in it:
            done += 1
            if done == resume_at:
                state = reader.state(h, done)
            elif done == resume_at + 1:
                expect = reader.ids(b).clone()
            if done > resume_at + 1 and (time.perf_counter() - t0 >= MIN_MEASURE_S):
                break
        dt, c1 = time.perf_counter() - t0, os.times()
        if expect is None:
            raise RuntimeError(f"the epoch has fewer than {resume_at + 1} batches: use more --tokens")
        tokens = (done - 1) * per_batch
        out["tokens_per_s"] = tokens / dt
        out["cpu_s_per_m"] = (c1.user - c0.user + c1.system - c0.system) / tokens * 1e6
        out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        del it
        for reopen in (False, True):
            t = time.perf_counter()
            got = reader.ids(next(reader.resume(h, state, reopen)))
            out["reopen_s" if reopen else "resume_s"] = time.perf_counter() - t
            out["resume_same"] = bool(out.get("resume_same", True) and torch.equal(got, expect))
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"[:300]
    return out


# ---------------------------------------------------------------------------- the parent: runs and table
def run_child(peer: str, corpus: Path, seq_len: int, batch: int, first_only: bool = False) -> dict:
    cmd = [sys.executable, __file__, "--child", peer, str(corpus), str(seq_len), str(batch)]
    if first_only:
        cmd.append("--first-only")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "loaders"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1])


def fmt(r: dict, key: str, scale: float = 1.0, spec: str = ".1f") -> str:
    return format(r[key] * scale, spec) if key in r else "-"


def main_table(root: Path, tokens: int, sparse: bool, dtypes: list[str], peers: list[str]) -> None:
    rows = []
    for dtype in dtypes:
        corpus = build_corpus(root, dtype, tokens, sparse)
        for seq_len in SEQ_LENS:
            for batch in BATCHES:
                for peer in peers:
                    r = run_child(peer, corpus, seq_len, batch)
                    rows.append((dtype, seq_len, batch, peer, r))
                    print(f"  {dtype} L={seq_len} B={batch} {peer}: {r}", flush=True)
    print(f"\n== {tokens:,} tokens{' (sparse files)' if sparse else ''}, shuffled, one process per reader ==")
    print(
        "| tokens | L | B | reader | M tokens/s | tokenmill / reader | tokenmill_input_ids / reader "
        "| CPU s per 1M tokens | first batch ms | peak MB | resume ms | reopen ms | resumed batch |"
    )
    print("|" + "---|" * 13)
    rate = {(p, d, s, b): r.get("tokens_per_s") for d, s, b, p, r in rows if p in TOKENMILL_READERS}
    for d, s, b, p, r in rows:
        if "error" in r and "first_batch_s" not in r:
            print(f"| {d} | {s} | {b} | {p} | n/a: {r['error']} ||||||||")
            continue
        ratios = " | ".join(
            f"{rate[(tm, d, s, b)] / r['tokens_per_s']:.2f}x"
            if rate.get((tm, d, s, b)) and "tokens_per_s" in r
            else "-"
            for tm in TOKENMILL_READERS
        )
        same = {True: "same", False: "DIFFERENT"}.get(r.get("resume_same"), "-")
        error = f" ({r['error']})" if "error" in r else ""
        print(
            f"| {d} | {s} | {b} | {p} | {fmt(r, 'tokens_per_s', 1e-6)} | {ratios} | {fmt(r, 'cpu_s_per_m', 1, '.4f')} "
            f"| {fmt(r, 'first_batch_s', 1e3, '.0f')} | {fmt(r, 'peak_mb', 1, '.0f')} | {fmt(r, 'resume_s', 1e3)} "
            f"| {fmt(r, 'reopen_s', 1e3)} | {same}{error} |"
        )


def first_batch_table(root: Path, tokens: int, dtypes: list[str], peers: list[str]) -> None:
    rows = []
    for dtype in dtypes:
        corpus = build_corpus(root, dtype, tokens, sparse=True)
        for peer in peers:
            r = run_child(peer, corpus, 2048, 8, first_only=True)
            rows.append((dtype, peer, r))
            print(f"  {dtype} {tokens:,} tokens {peer}: {r}", flush=True)
    print(f"\n== first batch at {tokens:,} tokens (generated sparse files), L=2048, B=8 ==")
    print("| tokens | reader | first batch ms | peak MB |")
    print("|---|---|---|---|")
    for dtype, peer, r in rows:
        first = fmt(r, "first_batch_s", 1e3, ".0f") + (f" (n/a: {r['error']})" if "error" in r else "")
        print(f"| {dtype} | {peer} | {first} | {fmt(r, 'peak_mb', 1, '.0f')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000_000, help="tokens per corpus (1_000_000_000: 1B; 0: skip)")
    ap.add_argument("--large-tokens", type=int, default=10_000_000_000, help="first-batch pass (0: skip)")
    ap.add_argument("--sparse-above", type=int, default=1_000_000_000, help="larger corpora are sparse files")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--dir", default="/tmp/tm_loader_peers")
    ap.add_argument("--child", nargs=4, metavar=("PEER", "CORPUS", "SEQ_LEN", "BATCH"), help=argparse.SUPPRESS)
    ap.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        peer, corpus, seq_len, batch = args.child
        print(json.dumps(child(peer, Path(corpus), int(seq_len), int(batch), args.first_only)), flush=True)
        return 0
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    peers = args.peers.split(",")
    dtypes = args.dtypes.split(",")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; corpora under {root}", flush=True)
    if args.tokens:
        main_table(root, args.tokens, args.tokens > args.sparse_above, dtypes, peers)
    if args.large_tokens:
        first_batch_table(root, args.large_tokens, dtypes, peers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
