"""What a tokenize run measured: counts as tasks finish, then the stage's `_stats.json` (plain data; the asset turns
it into Dagster metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tokenmill.stages.tokenize.encode import Encoder, SplitChunk, TaskResult
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill_loader.format import SPLITS

HIST_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


@dataclass
class SplitTotals:
    records: int = 0
    supervised: int = 0
    punct: int = 0
    text_chars: int = 0
    text_tokens: int = 0
    dropout: int = 0
    no_metadata: int = 0
    tokens_per_doc: list[np.ndarray] = field(default_factory=list)

    def add(self, ch: SplitChunk) -> None:
        self.records += ch.records
        for a in SplitChunk.COUNTS:
            setattr(self, a, getattr(self, a) + getattr(ch, a))
        self.tokens_per_doc.append(ch.rec_tokens.astype(np.int32))


@dataclass
class FirstRecord:
    """The first train record, shown decoded (prompt + first response for grpo)."""

    id: str
    ids: np.ndarray
    mask: np.ndarray | None

    @classmethod
    def of(cls, ch: SplitChunk, tt: str) -> FirstRecord:
        key = {"dpo": "chosen", "grpo": "prompts"}.get(tt, "sequence")
        mkey = {"sequence": "loss_mask", "chosen": "chosen_mask"}.get(key)
        n = int(ch.item_lens[key][0])
        ids = ch.data[key][:n].copy()
        mask = ch.data[mkey][:n].copy() if mkey in ch.data else None
        if tt == "grpo":
            m = int(ch.item_lens["responses"][0])
            ids = np.concatenate([ids, ch.data["responses"][:m]])
            mask = np.concatenate([np.zeros(n, np.uint8), ch.data["masks"][:m]])
        return cls(ch.ids[0], ids, mask)


@dataclass
class RunTotals:
    """Counts over every task result, in task order."""

    training_type: str
    docs_in: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    splits: dict[str, SplitTotals] = field(default_factory=lambda: {s: SplitTotals() for s in SPLITS})
    first: FirstRecord | None = None

    def add(self, result: TaskResult) -> None:
        self.docs_in += result.docs_in
        for r, c in result.reasons.items():
            self.reasons[r] = self.reasons.get(r, 0) + c
        for s, ch in result.splits.items():
            self.splits[s].add(ch)
            if self.first is None and s == "train" and ch.records:
                self.first = FirstRecord.of(ch, self.training_type)


def histogram(tokens_per_doc: np.ndarray) -> list[dict]:
    edges = HIST_EDGES + [np.inf]
    counts, _ = np.histogram(tokens_per_doc, bins=edges) if tokens_per_doc.size else ([0] * (len(edges) - 1), None)
    rows = []
    for lo, hi, c in zip(edges[:-1], edges[1:], counts):
        rows.append({"tokens": f"{lo}-{int(hi) - 1}" if hi != np.inf else f">={lo}", "docs": int(c)})
    while len(rows) > 1 and rows[-1]["docs"] == 0:
        rows.pop()
    return rows


def sample_markdown(tok, ids: np.ndarray, mask: np.ndarray | None) -> str:
    """Decoded tokens with masked spans in [brackets] (and ~~struck~~); trained text plain."""
    if mask is None:
        mask = np.ones(len(ids), dtype=np.uint8)
    out, i = [], 0
    while i < len(ids):
        j = i
        while j < len(ids) and mask[j] == mask[i]:
            j += 1
        text = tok.decode([int(x) for x in ids[i:j]], skip_special_tokens=False)
        out.append(text if mask[i] else f"[~~{text}~~]")
        i = j
    return "".join(out)


def _share(part: int, whole: int, digits: int = 4) -> float:
    return round(part / whole, digits) if whole else 0.0


def stage_stats(
    settings: ShardSettings,
    totals: RunTotals,
    manifests: dict[str, dict],
    *,
    enc: Encoder,
    token_dtype: np.dtype,
    bytes_on_disk: dict[str, int],
    seconds: float,
    workers: int,
    tasks: int,
) -> dict:
    """The stage's _stats.json: docs_in/docs_out/dropped_<reason>, tokens and shares, per split, the first record."""
    split_totals = [m["totals"] for m in manifests.values()]
    tokens = sum(t["tokens"] for t in split_totals)
    records = sum(t["records"] for t in split_totals)
    supervised = sum(t["supervised_tokens"] for t in split_totals)
    per_split = totals.splits.values()
    tpd = np.concatenate([a for t in per_split for a in t.tokens_per_doc]) if records else np.zeros(0, np.int32)
    text_chars = sum(t.text_chars for t in per_split)
    text_tokens = sum(t.text_tokens for t in per_split)
    punct = sum(t.punct for t in per_split)
    dropout = sum(t.dropout for t in per_split)
    no_metadata = sum(t.no_metadata for t in per_split)
    stats = {
        "docs_in": totals.docs_in,
        "docs_out": records,
        **{f"dropped_{r}": c for r, c in sorted(totals.reasons.items())},
        "training_type": settings.training_type,
        "settings": settings.model_dump(),
        "vocab_size": enc.vocab_size,
        "token_dtype": token_dtype.name,
        "records": records,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "masked_tokens": tokens - supervised,
        "supervised_share": _share(supervised, tokens),
        "masked_share": _share(tokens - supervised, tokens),
        "metadata_dropout": dropout,
        "metadata_dropout_share": _share(dropout, records),
        "no_metadata": no_metadata,
        "records_with_metadata": records - no_metadata - dropout if settings.training_type == "conditional" else 0,
        "chars_per_token": round(text_chars / text_tokens, 4) if text_tokens else None,
        "isolated_punctuation_tokens": punct,
        "isolated_punctuation_share": _share(punct, tokens, 5),
        "bytes_on_disk": bytes_on_disk,
        "tokens_per_doc": {
            "mean": round(float(tpd.mean()), 2) if tpd.size else 0.0,
            **{f"p{q}": int(np.percentile(tpd, q)) if tpd.size else 0 for q in (50, 90, 99)},
            "max": int(tpd.max()) if tpd.size else 0,
            "histogram": histogram(tpd),
        },
        "seconds": round(seconds, 3),
        "tokens_per_second": round(tokens / seconds, 1) if seconds else 0.0,
        "workers": workers,
        "tasks": tasks,
    }
    for s in SPLITS:
        t = manifests[s]["totals"]
        stats[f"{s}_tokens"], stats[f"{s}_records"] = t["tokens"], t["records"]
        stats[f"{s}_shards"] = len(manifests[s]["shards"])
        stats[s] = {"tokens": t["tokens"], "records": t["records"], "shards": stats[f"{s}_shards"]}
    if totals.first is not None:
        stats["sample"] = {
            "id": totals.first.id,
            "tokens": int(len(totals.first.ids)),
            "markdown": sample_markdown(enc.tok, totals.first.ids, totals.first.mask),
        }
    return stats
