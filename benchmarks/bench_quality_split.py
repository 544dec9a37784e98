"""Quality classifier on a real labelled split: `train_quality_model` (tokenmill's defaults, DCLM's fastText recipe)
taught to tell a web page's main content from the same page's boilerplate, with its held-out ROC AUC, and a second
split held out by page (k-fold over pages), so no page has one side in training and the other held out.

usage: python benchmarks/bench_quality_split.py --pages DIR [--out DIR] [--seed 42] [--folds 10] [--epoch 5]

Data: scrapinghub/article-extraction-benchmark (MIT licence; 181 real news and blog pages saved by headless
browser as html/<id>.html.gz, and ground-truth.json with each page's hand-checked articleBody). Nothing is
downloaded here; prepare --pages once from a snapshot of that repository (the figures in docs were taken at commit
4a3bc979f76c0df73cb95fe272e2fc1b96f9f010):

    git clone --bare https://github.com/scrapinghub/article-extraction-benchmark aeb.git   # or any mirror of it
    mkdir -p /tmp/aeb_pages
    git --git-dir=aeb.git archive 4a3bc979f76c0df73cb95fe272e2fc1b96f9f010 ground-truth.json html \
        | tar -x -C /tmp/aeb_pages
    python benchmarks/bench_quality_split.py --pages /tmp/aeb_pages

Classes, one pair per page:
  positive: the page's ground-truth articleBody;
  negative: the page's other text: the lxml text of its <body> cut at block-level elements (and <br>), script,
  style, noscript, template and comments left out, each block's whitespace collapsed, the blocks whose text occurs
  in the (whitespace-collapsed) articleBody or that share SHINGLE words in a row with it dropped, the rest joined
  by newlines. A page whose negative is under
  MIN_BOILERPLATE characters is skipped, both sides.

Split 1 (record level): both classes' .jsonl given to train_quality_model, which holds out 10% of each class
independently (its model.json metrics). Split 2 (page level): pages shuffled (seeded) into --folds folds; for each,
train_quality_model on the other folds' pages, and that fold's pages' texts, prepared as training prepares them,
scored by the loaded model; the AUC of each fold and of all folds' scores pooled (tokenmill's metrics.roc_auc).
CPU seconds: time.process_time of train_quality_model (reading, preparing, training, scoring its held-out share).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from lxml import etree, html

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tokenmill.quality_training import prepare_texts, train_quality_model  # noqa: E402
from tokenmill.stages.clean.settings import CleanSettings  # noqa: E402
from tokenmill.stages.quality_model import QualityTrainSettings, load_quality_model  # noqa: E402
from tokenmill.stages.quality_model.metrics import best_f1_threshold, roc_auc  # noqa: E402

MIN_BOILERPLATE = 100
# a block sharing this many words in a row with the article is article text, edited (a lede, a caption, a
# paragraph the ground truth cut): not boilerplate
SHINGLE = 8
BLOCK = frozenset(
    "address article aside blockquote br caption dd details dialog div dl dt fieldset figcaption figure footer form h1 "
    "h2 h3 h4 h5 h6 header hgroup hr li main nav ol p pre section summary table tbody td tfoot th thead tr ul".split()
)
NOT_TEXT = ("script", "style", "noscript", "template")
UTF8 = html.HTMLParser(encoding="utf-8")  # every page of the set is UTF-8; lxml's guess without a <meta> is Latin-1


def collapse(text: str) -> str:
    return " ".join(text.split())


def shingles(text: str) -> list[tuple[str, ...]]:
    words = text.split()
    return [tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)]


def page_blocks(raw: bytes) -> list[str]:
    """The whitespace-collapsed text of each block of the page's <body>, in document order, empty ones left out."""
    root = html.document_fromstring(raw, parser=UTF8)
    etree.strip_elements(root, *NOT_TEXT, etree.Comment, with_tail=False)
    body = root.find("body")
    blocks: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        text = collapse("".join(pending))
        if text:
            blocks.append(text)
        pending.clear()

    # a block's start and end both cut: text before and after a nested block are separate blocks
    for event, el in etree.iterwalk(root if body is None else body, events=("start", "end")):
        if event == "start":
            if el.tag in BLOCK:
                flush()
            pending.append(el.text or "")
        else:
            if el.tag in BLOCK:
                flush()
            pending.append(el.tail or "")
    flush()
    return blocks


def build_pairs(pages: Path) -> tuple[list[tuple[str, str, str]], int]:
    """(page id, positive text, negative text) of every page kept, and how many were skipped for short boilerplate."""
    truth = json.loads((pages / "ground-truth.json").read_text(encoding="utf-8"))
    pairs, skipped = [], 0
    for page_id in sorted(truth):
        body = truth[page_id]["articleBody"]
        article = collapse(body)
        grams = set(shingles(article))
        raw = gzip.decompress((pages / "html" / f"{page_id}.html.gz").read_bytes())
        boilerplate = "\n".join(
            b for b in page_blocks(raw) if b not in article and not any(g in grams for g in shingles(b))
        )
        if len(boilerplate) < MIN_BOILERPLATE:
            skipped += 1
            continue
        pairs.append((page_id, body, boilerplate))
    return pairs, skipped


def write_classes(pairs: list[tuple[str, str, str]], folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "positive.jsonl", folder / "negative.jsonl"
    for path, side in zip(paths, (1, 2)):
        with open(path, "w", encoding="utf-8") as f:
            for pair in pairs:
                f.write(json.dumps({"id": pair[0], "text": pair[side]}, ensure_ascii=False) + "\n")
    return paths


def timed_training(pairs, folder: Path, settings: QualityTrainSettings):
    positive, negative = write_classes(pairs, folder / "data")
    start = time.process_time()
    card = train_quality_model([positive], [negative], folder / "model", settings)
    return card, time.process_time() - start


def page_folds(pairs, folds: int, seed: int, work: Path, settings: QualityTrainSettings) -> None:
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    clean = CleanSettings()
    pooled_scores, pooled_labels = [], []
    print(f"\nsplit 2, held out by page: {folds} folds of the {len(pairs)} pages (seed {seed})")
    print(f"{'fold':>4} {'train pages':>11} {'held pages':>10} {'held pos':>8} {'held neg':>8} {'AUC':>8} {'CPU s':>7}")
    for fold in range(folds):
        held = set(order[fold::folds])
        train = [p for i, p in enumerate(pairs) if i not in held]
        card, cpu = timed_training(train, work / f"fold{fold}", settings)
        model = load_quality_model(work / f"fold{fold}" / "model" / card.model_file)
        positives = prepare_texts([pairs[i][1] for i in sorted(held)], clean)
        negatives = prepare_texts([pairs[i][2] for i in sorted(held)], clean)
        scores = model.score(positives + negatives).astype(np.float64)
        labels = np.array([True] * len(positives) + [False] * len(negatives))
        pooled_scores.append(scores)
        pooled_labels.append(labels)
        row = f"{fold:>4} {len(train):>11} {len(held):>10} {len(positives):>8} {len(negatives):>8}"
        print(f"{row} {roc_auc(scores, labels):>8.4f} {cpu:>7.1f}")
        del model  # its linear form holds bucket x dim floats: one fold's at a time
        for path in (work / f"fold{fold}").rglob("*"):  # 800 MB model.bin per fold
            if path.is_file():
                path.unlink()
    scores, labels = np.concatenate(pooled_scores), np.concatenate(pooled_labels)
    threshold, precision, recall = best_f1_threshold(scores, labels)
    print(
        f"pooled over all folds: {int(labels.sum())} positive, {int((~labels).sum())} negative, "
        f"ROC AUC {roc_auc(scores, labels):.4f}, best-F1 threshold {threshold:.6f}, "
        f"precision {precision:.4f}, recall {recall:.4f}"
    )
    # few examples and few epochs leave the scores near 0.5: the ranking (AUC) means more than the cut
    for name, side in (("positive", labels), ("negative", ~labels)):
        low, mid, high = np.quantile(scores[side], [0, 0.5, 1])
        print(f"  {name} scores: min {low:.6f}, median {mid:.6f}, max {high:.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=Path, required=True, help="folder with ground-truth.json and html/")
    parser.add_argument("--out", type=Path, help="keep split 1's model (model.bin, model.json) here")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--folds", type=int, default=10, help="page-level folds (10: 90%% of pages train)")
    parser.add_argument(
        "--epoch", type=int, default=QualityTrainSettings.epoch, help="fastText epochs (default: DCLM's 5)"
    )
    args = parser.parse_args()

    settings = QualityTrainSettings(seed=args.seed, epoch=args.epoch)
    pairs, skipped = build_pairs(args.pages)
    chars = {name: [len(p[side]) for p in pairs] for name, side in (("positive", 1), ("negative", 2))}
    print(f"pages: {len(pairs)} kept, {skipped} skipped (boilerplate under {MIN_BOILERPLATE} characters)")
    for name, lengths in chars.items():
        print(f"  {name}: median {int(np.median(lengths))} characters, {sum(lengths)} in all")
    print(
        f"settings: word_ngrams {settings.word_ngrams}, dim {settings.dim}, epoch {settings.epoch}, lr {settings.lr}, "
        f"min_count {settings.min_count}, bucket {settings.bucket}, held_out_share {settings.held_out_share}"
    )

    with tempfile.TemporaryDirectory(prefix="bench_quality_split_") as tmp:
        work = Path(tmp)
        card, cpu = timed_training(pairs, work / "split1", settings)
        m = card.metrics
        print("\nsplit 1, held out by record (train_quality_model's own 10% of each class):")
        for name, counts in card.examples.items():
            print(f"  {name}: {counts['read']} read, {counts['trained']} trained, {counts['held_out']} held out")
        print(
            f"  ROC AUC {m['roc_auc']:.4f}, threshold {m['threshold']:.6f}, precision {m['precision']:.4f}, "
            f"recall {m['recall']:.4f}, training CPU {cpu:.1f} s"
        )
        hist = m["histogram"]
        print(f"  score histogram, edges {hist['edges']}: positive {hist['positive']}, negative {hist['negative']}")
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            for path in (work / "split1" / "model").iterdir():
                path.replace(args.out / path.name)
        page_folds(pairs, args.folds, args.seed, work, settings)


if __name__ == "__main__":
    main()
