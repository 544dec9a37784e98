"""Quality-model scoring speed, in one run: a fastText classifier trained with DCLM's recipe (tokenmill's defaults:
word bigrams, dim 100, 2M buckets) on ~2 kB generated web-like documents, in documents per CPU-second of scoring
(the target: 20,000) beside the C++ predict line by line; a worker's first task with and without the linear form
the first one saved; the whole clean stage on a second batch with and without the model (the step's share of its
CPU: target 10%) and the preparation alone (prepare_batch); and transformers sequence-classification models with random
weights (a tiny and a small BERT, a WordPiece tokenizer trained on the same documents)
on the CPU, in documents/s. Nothing is downloaded.

usage: python benchmarks/bench_quality_model.py [--docs 5000] [--transformer-docs 256] [--max-tokens 512]
                                             [--gpu-docs 4096]

Where torch sees a CUDA device, a last row scores --gpu-docs documents with a BERT-base-sized classifier (random
weights) in bf16 and reports docs/s, the GPU's utilisation (nvidia-smi) and the tokenizer's share of the time.

Documents: sentences of words drawn from a Zipf-distributed vocabulary of 30,000 generated words, a paragraph of
4-8 sentences, paragraphs appended until the document reaches 2,000 characters. Speed: the process's CPU time
(time.process_time) of score() alone, after one warm-up call; torch on its default threads (its docs/s are wall
clock and CPU-seconds both printed).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.tiny_models import random_bert  # noqa: E402
from tokenmill.common.io import record_id  # noqa: E402
from tokenmill.stages.clean import clean_corpus  # noqa: E402
from tokenmill.stages.clean.prepare import BATCH, prepare_batch  # noqa: E402
from tokenmill.stages.clean.report import Timer  # noqa: E402
from tokenmill.stages.clean.settings import CleanSettings  # noqa: E402
from tokenmill.stages.quality_model import (  # noqa: E402
    QualityTrainSettings,
    load_quality_model,
    train_fasttext,
)
from tokenmill.stages.quality_model.fasttext_model import FastTextScorer  # noqa: E402
from tokenmill.stages.quality_model.model import hashed_model_id  # noqa: E402

TARGET_DOCS_PER_CPU_S = 20_000  # issue 48: fastText scoring of 2 kB web documents
DOC_CHARS = 2_000
STAGE_RUNS = 3
VOCABULARY = 30_000
TRAIN_DOCS = 4_000


def vocabulary(rng: random.Random) -> list[str]:
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(VOCABULARY)]


def documents(rng: random.Random, words: list[str], count: int, skew: float) -> list[str]:
    """`count` documents of >= DOC_CHARS characters; `skew` the Zipf exponent (the two classes differ in it and in
    which end of the vocabulary they favour)."""
    weights = 1 / np.arange(1, len(words) + 1) ** skew
    draw = np.random.default_rng(rng.randrange(1 << 30))
    picks = draw.choice(len(words), size=count * 500, p=weights / weights.sum())
    docs, at = [], 0
    for _ in range(count):
        paragraphs, length = [], 0
        while length < DOC_CHARS:
            sentences = []
            for _ in range(rng.randint(4, 8)):
                n = rng.randint(6, 20)
                sentence = " ".join(words[i] for i in picks[at : at + n])
                at = (at + n) % (len(picks) - 20)
                sentences.append(sentence.capitalize() + ".")
            paragraphs.append(" ".join(sentences))
            length += len(paragraphs[-1]) + 1
        docs.append("\n".join(paragraphs))
    return docs


def cpu_rate(model, texts: list[str]) -> tuple[float, float]:
    """(docs per CPU-second, docs per wall-second) of model.score over `texts`, after a warm-up call."""
    model.score(texts[:32])
    cpu, wall = time.process_time(), time.perf_counter()
    model.score(texts)
    return len(texts) / (time.process_time() - cpu), len(texts) / (time.perf_counter() - wall)


LOAD_PROBE = """
import re, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tokenmill.stages.quality_model.fasttext_model import FastTextScorer
cpu = time.process_time()
FastTextScorer(Path(sys.argv[2]), 512, linear_cache=Path(sys.argv[3]))
# VmHWM: this process's own peak (ru_maxrss keeps the parent's from before exec)
peak_kb = re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1)
print(time.process_time() - cpu, int(peak_kb) / 1024)
"""


def load_cost(model: Path, linear_cache: Path) -> tuple[float, float]:
    """(CPU seconds, peak RSS in MB) of a fresh process making a scorer, as a score task's worker does on its first
    task (the process's start and imports not counted in the seconds)."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD_PROBE, str(REPO), str(model), str(linear_cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, peak_mb = done.stdout.split()
    return float(seconds), float(peak_mb)


def write_raw_batch(folder: Path, texts: list[str], source: str) -> None:
    """`texts` as one raw_records batch (one shard), ids as raw_records gives them."""
    folder.mkdir(parents=True)
    with open(folder / "part-00000.jsonl", "w", encoding="utf-8") as out:
        for line, text in enumerate(texts, 1):
            record = {
                "id": record_id(source, line=line),
                "text": text,
                "meta": {},
                "source": {"path": source, "line": line},
            }
            out.write(json.dumps(record) + "\n")


def stage_cpu(raw: Path, out: Path, **settings) -> tuple[float, dict[str, float]]:
    """CPU seconds of clean_corpus over the batch `raw` (one worker: in this process), and its passes' seconds."""
    cpu = time.process_time()
    result = clean_corpus(raw, out, CleanSettings(quality="web", **settings), workers=1)
    return time.process_time() - cpu, result.pass_seconds


def clean_cpu_rate(texts: list[str]) -> float:
    """Docs per CPU-second of the clean stage's preparation function (prepare_batch, default settings) of `texts`:
    a lower bound of the stage's cost, which reads, writes and runs the web rules besides."""
    records = [(b"", {"text": text, "meta": {}}) for text in texts]
    batches = [records[i : i + BATCH] for i in range(0, len(records), BATCH)]
    settings = CleanSettings()
    cpu = time.process_time()
    for batch in batches:
        prepare_batch(batch, settings, Timer(), Counter())
    return len(texts) / (time.process_time() - cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=5_000, help="documents fastText scores")
    parser.add_argument("--transformer-docs", type=int, default=256, help="documents each transformers model scores")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--gpu-docs", type=int, default=4096, help="documents BERT-base scores on CUDA, where there is one"
    )
    args = parser.parse_args()
    rng = random.Random(0)
    words = vocabulary(rng)
    good = documents(rng, words, TRAIN_DOCS // 2 + args.docs // 2, 1.1)
    bad = documents(rng, words[::-1], TRAIN_DOCS // 2 + args.docs // 2, 0.9)
    train = good[: TRAIN_DOCS // 2] + bad[: TRAIN_DOCS // 2]
    test = good[TRAIN_DOCS // 2 :] + bad[TRAIN_DOCS // 2 :]
    print(f"{len(test)} documents, {sum(map(len, test)) / len(test):.0f} characters each on average")
    with tempfile.TemporaryDirectory() as tmp:
        order = rng.sample(range(len(train)), len(train))
        path = Path(tmp) / "model.bin"
        train_fasttext([train[i] for i in order], [i < TRAIN_DOCS // 2 for i in order], path, QualityTrainSettings())
        model = load_quality_model(path, max_tokens=args.max_tokens)
        fasttext_rate, _ = cpu_rate(model, test)
        per_line_rate, _ = cpu_rate(FastTextScorer(path, args.max_tokens, per_line=True), test)
        print(
            f"fastText (DCLM recipe, {path.stat().st_size / 1e6:.0f} MB): {fasttext_rate:,.0f} docs per CPU-second, "
            f"{fasttext_rate / TARGET_DOCS_PER_CPU_S:.2f}x the {TARGET_DOCS_PER_CPU_S:,} target; the C++ predict "
            f"line by line: {per_line_rate:,.0f} ({fasttext_rate / per_line_rate:.2f}x as many)"
        )
        cache = Path(tmp) / "model.linear-v1.npz"
        built, (cached, cached_peak) = load_cost(path, cache), load_cost(path, cache)
        print(
            f"a worker's first task: loading the model and building its linear form {built[0]:.2f} CPU-s, peak "
            f"{built[1]:,.0f} MB; from the linear form the first worker saved ({cache.stat().st_size / 1e6:.0f} MB, "
            f"in the score store) {cached:.2f} CPU-s, peak {cached_peak:,.0f} MB ({built[0] / cached:.0f}x less CPU)"
        )
        # the whole clean stage on a new batch (no stored scores; the linear form the first batch left), with and
        # without the model: its step's share of the stage, all of it (reading, rules, boilerplate, writing, select)
        half = len(test) // 2
        for name, texts in (("first", test[:half:2] + test[half::2]), ("new", test[1:half:2] + test[half + 1 :: 2])):
            write_raw_batch(Path(tmp) / "raw" / name, texts, f"{name}.jsonl")
        stage = Path(tmp) / "cleaned"
        with_model = {"quality_model": str(path), "quality_keep_share": 0.5}
        stage_cpu(Path(tmp) / "raw" / "first", stage / "first", **with_model)
        runs = []
        for run in range(STAGE_RUNS):  # in turns: the machine's load falls on both alike
            without, _ = stage_cpu(Path(tmp) / "raw" / "new", stage / f"plain-{run}")
            scored, passes = stage_cpu(Path(tmp) / "raw" / "new", stage / f"new-{run}", **with_model)
            runs.append((without, scored, passes["quality"], sum(passes.values())))
        cpu = time.process_time()
        hashed_model_id(path, [path])  # the first batch's, remembered for the next ones while the file is untouched
        hashing = time.process_time() - cpu
        without, scored, step, stage_s = (float(np.median(column)) for column in zip(*runs))
        print(
            f"clean stage (clean_corpus, web rules, one worker) on a second batch of {half:,} new documents, median of "
            f"{STAGE_RUNS} pairs: {without:.2f} CPU-s without the model, {scored:.2f} with it "
            f"({(scored - without) / without:+.1%}); the step itself {step:.2f} s of the stage's {stage_s:.2f} s, "
            f"{step / (stage_s - step):.1%} of the rest (target: at most 10%); the first batch also hashes the model "
            f"to its id ({hashing:.2f} CPU-s) and builds its linear form"
        )
        clean_rate = clean_cpu_rate(test)
        print(
            f"the preparation function alone (prepare_batch, CleanSettings(): the curated profile these documents get, "
            f"not the web rules above): {clean_rate:,.0f} docs per CPU-second; scoring alone is "
            f"{clean_rate / fasttext_rate:.1%} of it"
        )
        sample = test[: args.transformer_docs // 2] + test[-(args.transformer_docs // 2) :]
        bert_sizes = (("tiny BERT (hidden 32, 2 layers)", 32, 2), ("small BERT (hidden 256, 4 layers)", 256, 4))
        for name, hidden, layers in bert_sizes:
            folder = Path(tmp) / name.split()[0]
            random_bert(folder, train[:500], hidden=hidden, layers=layers, vocab_size=8_000)
            scorer = load_quality_model(folder, device="cpu", max_tokens=args.max_tokens)
            per_cpu_s, per_s = cpu_rate(scorer, sample)
            print(
                f"{name}, CPU, {args.max_tokens} tokens: {per_s:,.1f} docs/s ({per_cpu_s:,.1f} per CPU-second), "
                f"fastText {fasttext_rate / per_cpu_s:,.0f}x as many per CPU-second"
            )
        gpu_row(Path(tmp) / "bert-base", train[:2000], test[: args.gpu_docs], args.max_tokens)


GPU_SAMPLE_MS = 200  # nvidia-smi's sampling period while the GPU row scores


def gpu_row(folder: Path, train: list[str], texts: list[str], max_tokens: int) -> None:
    """A BERT-base-sized classifier (hidden 768, 12 layers, random weights) on CUDA in bf16: docs/s, the GPU's
    utilisation sampled by nvidia-smi while it scores, and the tokenizer's share of the time (the CPU side)."""
    import torch

    if not torch.cuda.is_available():
        print("BERT-base on a GPU: no CUDA device here, row skipped (run this benchmark where one is lent)")
        return
    random_bert(folder, train, hidden=768, layers=12, vocab_size=30_000, max_positions=max(512, max_tokens))
    scorer = load_quality_model(folder, device="cuda", max_tokens=max_tokens)
    scorer.score(texts[:64])  # warm-up: kernels, allocator
    cpu = time.process_time()
    scorer.scorer.tokenizer(texts, truncation=True, max_length=max_tokens)
    tokenizing = time.process_time() - cpu
    sampler = subprocess.Popen(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", f"-lms={GPU_SAMPLE_MS}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    torch.cuda.synchronize()
    wall = time.perf_counter()
    scorer.score(texts)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - wall
    sampler.terminate()
    samples = [int(line) for line in sampler.communicate()[0].split() if line.isdigit()]
    utilisation = f"{np.mean(samples):.0f}% mean, {np.percentile(samples, 10):.0f}% p10" if samples else "not sampled"
    print(
        f"BERT-base (hidden 768, 12 layers), {torch.cuda.get_device_name()}, bf16, {max_tokens} tokens: "
        f"{len(texts) / seconds:,.0f} docs/s; GPU utilisation {utilisation}; tokenizing took {tokenizing:.2f} "
        f"CPU-s of the {seconds:.2f} s ({tokenizing / seconds:.0%}: above ~50%, the CPU side would be the bottleneck)"
    )


if __name__ == "__main__":
    main()
