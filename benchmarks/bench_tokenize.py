#!/usr/bin/env python3
"""Benchmark of the tokenizer and tokenized_bins stages on a real corpus (default ../shared/corpora/chinese-poetry).

Prints:
  - tokenizer training: tokenmill's bounded sample vs the reference approach (train on every record,
    as ../shared/reference/seed_reference.py does), with chars/token of both on the same held-out text;
  - the encoder alone: the piece encoder against HF's encode_batch_fast on one thread, CPU seconds on the same texts;
  - tokens/s of the whole tokenize_corpus function (read JSONL, split, render, encode, pack, write shards)
    next to the ceiling measured in the same run: `Tokenizer.encode_batch` alone (rayon threads on every
    core) on the same rendered texts, best of --repeat interleaved runs; the ratio (target >= 0.7).

usage: python benchmarks/bench_tokenize.py [SOURCE] [--repeat 3] [--workers N] [--skip-reference]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from tokenmill.common.io import iter_jsonl, record_shards  # noqa: E402
from tokenmill.common.parallel import close_workers  # noqa: E402
from tokenmill.stages.tokenize import (  # noqa: E402
    ShardSettings,
    TokenizeResult,
    TokenizerSettings,
    tokenize_corpus,
    train_tokenizer,
)
from tokenmill.stages.tokenize.render import metadata_dropped  # noqa: E402
from tokenmill.stages.tokenize.tokenizer import hash64, load_tokenizer  # noqa: E402
from tokenmill.stages.tokenize.train import HELD_OUT_MODULUS, build_trainer_tokenizer, training_text  # noqa: E402


def prepare_input(source: Path, out: Path) -> int:
    """Raw records of the corpus (tokenmill.stages.raw.ingest; a minimal reader when it is unavailable)."""
    try:
        from tokenmill.stages.raw import ingest
    except ImportError:
        ingest = None
    if ingest is not None:
        return ingest(source, out).docs_out
    import hashlib

    recs = []
    for p in sorted(source.rglob("*.json")):
        data = json.loads(p.read_text(encoding="utf-8"))
        if not isinstance(data, list):
            continue
        rel = str(p.relative_to(source))
        for i, o in enumerate(data):
            body = o.get("paragraphs") or o.get("content") or [] if isinstance(o, dict) else []
            text = "\n".join(x for x in ([body] if isinstance(body, str) else body) if isinstance(x, str))
            if text.strip():
                rid = hashlib.blake2b(f"{rel}\0index:{i}".encode(), digest_size=8).hexdigest()
                recs.append(
                    {
                        "id": rid,
                        "text": text,
                        "meta": {"title": o.get("title") or o.get("rhythmic") or "", "author": o.get("author") or ""},
                        "source": {"path": rel, "index": i},
                    }
                )
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "part-00000.jsonl", "w", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(recs)


def rendered_texts(in_dir: Path, s: ShardSettings) -> list[str]:
    """The conditional rendering as one string per document (special tokens inline)."""
    texts = []
    for p in record_shards(in_dir):
        for r in iter_jsonl(p):
            if not r.get("text"):
                continue  # rejected by tokenize_corpus (empty_text)
            meta = r.get("meta") or {}
            title, author = meta.get("title") or "", meta.get("author") or ""
            if (not title and not author) or metadata_dropped(r["id"], s.seed, s.metadata_dropout):
                texts.append(f"<|content|>{r['text']}</s>")
            else:
                texts.append(f"<|title|>{title}<|author|>{author}<|content|>{r['text']}</s>")
    return texts


def ceiling(tok_path: Path, texts: list[str], batch: int = 8192) -> tuple[float, int]:
    tok = load_tokenizer(tok_path)
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), batch):
        n += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + batch], add_special_tokens=False))
    return time.perf_counter() - t0, n


def encoders(tok_path: Path, in_dir: Path, batch: int = 2048) -> None:
    """The piece encoder against HF's `encode_batch_fast` on one thread, on the records' texts: CPU seconds of each
    (best of 3, in turn) and whether every record's ids agree."""
    import os

    parallelism = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread, as in a worker process
    try:
        _compare_encoders(tok_path, in_dir, batch)
    finally:
        os.environ.pop("TOKENIZERS_PARALLELISM")
        if parallelism is not None:
            os.environ["TOKENIZERS_PARALLELISM"] = parallelism


def _compare_encoders(tok_path: Path, in_dir: Path, batch: int) -> None:
    from tokenmill.stages.tokenize.piece_bpe import PieceEncoder

    texts = [r["text"] for p in record_shards(in_dir) for r in iter_jsonl(p) if r.get("text")]
    batches = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    tok = load_tokenizer(tok_path)
    tok.encode_special_tokens = True
    if PieceEncoder.build(tok, tok_path.read_text(encoding="utf-8")) is None:
        print("piece encoder: not for this tokenizer (HF encodes)")
        return
    hf_s = ours_s = float("inf")
    for _ in range(3):
        c0 = time.process_time()
        hf = [e.ids for b in batches for e in tok.encode_batch_fast(b, add_special_tokens=False)]
        c1 = time.process_time()
        pieces = PieceEncoder.build(tok, tok_path.read_text(encoding="utf-8"))  # an empty piece cache each round
        assert pieces is not None
        ours = [pieces.encode(b) for b in batches]
        c2 = time.process_time()
        hf_s, ours_s = min(hf_s, c1 - c0), min(ours_s, c2 - c1)
    flat = [ids.tolist() for got in ours if got for ids in np.split(got[0], np.cumsum(got[1])[:-1])]
    tokens = sum(map(len, hf))
    print(
        f"encoder alone on {len(texts):,} texts, {tokens:,} tokens (CPU-s, best of 3): HF encode_batch_fast "
        f"{hf_s:.2f} ({hf_s / tokens * 1e9:.0f} ns a token), piece encoder {ours_s:.2f} "
        f"({ours_s / tokens * 1e9:.0f} ns): {hf_s / ours_s:.2f}x; ids identical: {flat == hf}"
    )


def reference_training(in_dir: Path) -> tuple[float, object]:
    """The seed's approach: train on every record (title\\nauthor\\ntext), default threading."""
    texts = []
    for p in record_shards(in_dir):
        for r in iter_jsonl(p):
            meta = r.get("meta") or {}
            texts.append(f"{meta.get('title') or ''}\n{meta.get('author') or ''}\n{r['text']}")
    tok, trainer = build_trainer_tokenizer(4096, 2, "bytelevel")
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return time.perf_counter() - t0, tok


def held_out(in_dir: Path, limit: int = 3000) -> list[str]:
    out = []
    for p in record_shards(in_dir):
        for r in iter_jsonl(p):
            if hash64("tokenizer-sample", r["id"]) % HELD_OUT_MODULUS == 0:
                out.append(training_text(r))
    return out[:limit]


def cpt(tok, texts) -> float:
    return sum(map(len, texts)) / max(1, sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)))


class PeakRSS:
    """Samples the summed RSS of this process and its children (/proc) in a thread: the stage's real peak."""

    def __init__(self, interval: float = 0.1):
        import os
        import threading

        self.pid, self.peak, self.interval = os.getpid(), 0, interval
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _rss(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/statm") as f:
                return int(f.read().split()[1]) * 4096
        except OSError:
            return 0

    def _children(self) -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == self.pid:
                        out.append(int(d.name))
                except (OSError, IndexError, ValueError):
                    pass
        return out

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self._rss(self.pid) + sum(self._rss(c) for c in self._children()))

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *_):
        self._stop.set()
        self._t.join()


def cpu_seconds() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("source", nargs="?", default=str(REPO.parent / "shared" / "corpora" / "chinese-poetry"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--training-type", default="conditional")
    ap.add_argument("--skip-reference", action="store_true", help="skip training on every record (slow)")
    ap.add_argument("--keep", help="keep the work folder here")
    args = ap.parse_args()

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench_tokenize_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        raw = work / "records"
        shutil.rmtree(raw, ignore_errors=True)
        t0 = time.perf_counter()
        n = prepare_input(Path(args.source), raw)
        print(f"input: {n:,} records from {args.source} ({time.perf_counter() - t0:.1f} s)")

        tok_dir = work / "tokenizer"
        shutil.rmtree(tok_dir, ignore_errors=True)
        ts = train_tokenizer(raw, tok_dir, TokenizerSettings())
        print(
            f"tokenizer (tokenmill, {ts.settings['pretokenizer']}): {ts.train_seconds:.2f} s training + "
            f"{ts.sample_seconds:.2f} s sampling on {ts.sample_records:,} records / {ts.sample_chars:,} "
            f"chars; held-out chars/token {ts.chars_per_token}"
        )

        encoders(tok_dir / "tokenizer.json", raw)
        settings = ShardSettings(training_type=args.training_type)
        texts = rendered_texts(raw, settings) if args.training_type == "conditional" else None
        best_ours = best_ceiling = cpu_ours = cpu_ceiling = None
        result: TokenizeResult | None = None
        ceil_tokens = None
        peak = 0
        for rep in range(args.repeat):
            out = work / "bins"
            shutil.rmtree(out, ignore_errors=True)
            c0, t0 = cpu_seconds(), time.perf_counter()
            with PeakRSS() as rss:
                result = tokenize_corpus(raw, tok_dir, out, settings, workers=args.workers)
                close_workers()  # joined, so RUSAGE_CHILDREN holds the workers' CPU (the pool outlives a call)
            dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
            peak = max(peak, rss.peak)
            best_ours = dt if best_ours is None else min(best_ours, dt)
            cpu_ours = dc if cpu_ours is None else min(cpu_ours, dc)
            line = f"run {rep + 1}: tokenize_corpus {dt:.2f} s ({result.tokens / dt:,.0f} tokens/s, {dc:.1f} cpu-s)"
            if texts is not None:
                c0 = cpu_seconds()
                c, ceil_tokens = ceiling(tok_dir / "tokenizer.json", texts)
                dc = cpu_seconds() - c0
                best_ceiling = c if best_ceiling is None else min(best_ceiling, c)
                cpu_ceiling = dc if cpu_ceiling is None else min(cpu_ceiling, dc)
                line += f"; ceiling encode_batch {c:.2f} s ({ceil_tokens / c:,.0f} tokens/s, {dc:.1f} cpu-s)"
            print(line, flush=True)
        assert result is not None, "--repeat must be at least 1"
        tokens = result.tokens
        print(
            f"tokens {tokens:,} (ceiling encoded {ceil_tokens if ceil_tokens is not None else '-'}), "
            f"records {result.records:,}, supervised {result.supervised_share:.2%}, "
            f"masked {result.masked_share:.2%}, dropout {result.metadata_dropout_share:.2%}, "
            f"isolated punctuation {result.isolated_punctuation_share:.2%}, train/val shards "
            f"{result.train_shards}/{result.val_shards}"
        )
        print(f"tokens/s whole function (best of {args.repeat}): {tokens / best_ours:,.0f}")
        if best_ceiling is not None:
            print(f"tokens/s ceiling encode_batch (best of {args.repeat}): {ceil_tokens / best_ceiling:,.0f}")
            print(
                f"ratio: {(tokens / best_ours) / (ceil_tokens / best_ceiling):.2f} (target >= 0.7); "
                f"cpu-time ratio (ceiling cpu-s / ours, robust to a busy machine): {cpu_ceiling / cpu_ours:.2f}"
            )
        print(f"peak RSS of tokenize_corpus (parent + workers): {peak / 2**20:.0f} MiB")

        if not args.skip_reference:
            held = held_out(raw)
            ours_tok = load_tokenizer(tok_dir / "tokenizer.json")
            ref_s, ref_tok = reference_training(raw)
            print(
                f"tokenizer (reference: bytelevel, every record, default threads): {ref_s:.2f} s training; "
                f"chars/token on our held-out records {cpt(ref_tok, held):.4f} (trained on them too) vs ours "
                f"{cpt(ours_tok, held):.4f}; speed-up {ref_s / max(ts.train_seconds, 1e-9):.1f}x"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
