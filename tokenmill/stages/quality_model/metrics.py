"""How well scores separate the held-out positives from the negatives: ROC AUC, the threshold of best F1 with its
precision and recall, a histogram of each class's scores, and a warning when the scores barely move."""

from __future__ import annotations

import numpy as np

# held-out scores whose 5th to 95th percentiles lie closer than this rank the classes, but no threshold a person
# would write cuts between them: fastText with few examples and DCLM's 5 epochs leaves every score near 0.5
MIN_SCORE_SPREAD = 0.01


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """The chance a random positive outscores a random negative (ties count half): the Mann-Whitney U over ranks."""
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2  # 1-based rank of each distinct score, ties averaged
    ranks = mean_rank[inverse]
    n_pos = int(positive.sum())
    n_neg = len(positive) - n_pos
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def best_f1_threshold(scores: np.ndarray, positive: np.ndarray) -> tuple[float, float, float]:
    """(threshold, precision, recall) of the cut `score >= threshold` with the best F1 on the positives."""
    order = np.argsort(-scores, kind="stable")
    ranked, hits = scores[order], positive[order]
    true_pos = np.cumsum(hits)
    kept = np.arange(1, len(ranked) + 1)
    last_of_value = np.r_[ranked[1:] != ranked[:-1], True]  # a cut falls between distinct scores only
    precision = (true_pos / kept)[last_of_value]
    recall = (true_pos / max(int(positive.sum()), 1))[last_of_value]
    f1 = np.where(precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-12), 0.0)
    best = int(np.argmax(f1))
    return float(ranked[last_of_value][best]), float(precision[best]), float(recall[best])


def spread_warnings(scores: np.ndarray) -> list[str]:
    """A warning when the middle 90% of the held-out scores spans less than MIN_SCORE_SPREAD."""
    low, high = (float(v) for v in np.percentile(scores, [5, 95]))
    if high - low >= MIN_SCORE_SPREAD:
        return []
    return [
        f"held-out scores span only {high - low:.2g} (5th to 95th percentile, {low:.4f} to {high:.4f}): the model "
        "ranks, but a quality_threshold hardly cuts; train longer (--epoch) or on more examples, or keep by rank "
        "with quality_keep_share"
    ]


def held_out_metrics(scores: np.ndarray, positive: np.ndarray, bins: int) -> dict:
    """The card's metrics for scores in [0, 1] of held-out texts whose class is `positive` (bool per text)."""
    positive = np.asarray(positive, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    threshold, precision, recall = best_f1_threshold(scores, positive)
    edges = np.linspace(0.0, 1.0, bins + 1)
    return {
        "roc_auc": round(roc_auc(scores, positive), 6),
        "threshold": threshold,  # unrounded: rounding up would move the cut past its own score
        "precision": round(precision, 6),
        "recall": round(recall, 6),
        "held_out": {"positive": int(positive.sum()), "negative": int((~positive).sum())},
        "histogram": {
            "edges": [round(float(e), 6) for e in edges],
            "positive": np.histogram(scores[positive], edges)[0].tolist(),
            "negative": np.histogram(scores[~positive], edges)[0].tolist(),
        },
        "warnings": spread_warnings(scores),
    }
