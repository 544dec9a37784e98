"""What tokenize runs measured: counts per input batch as tasks finish (kept beside the shards), then the stage's
result over every batch of the published version (plain data; the asset turns it into Dagster metadata)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tokenmill.common.results import StageResult, run_fact
from tokenmill.common.samples import ReasonSamples
from tokenmill.stages.tokenize.encode import SPLIT_COUNTS, Encoder, SplitChunk, SplitCounts, TaskResult
from tokenmill.stages.tokenize.render import VAL_MOVED_KEY, TrainingTypeChoice
from tokenmill.stages.tokenize.settings import ShardSettings
from tokenmill_loader.format import SPLITS

HIST_EDGES = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


@dataclass(kw_only=True)
class SplitTotals(SplitCounts):
    """The counts of one split of a batch over its tasks' chunks, and the tokens of each record."""

    records: int = 0
    tokens_per_doc: list[np.ndarray] = field(default_factory=list)

    def add(self, ch: SplitChunk) -> None:
        self.records += ch.records
        self.add_counts(ch)
        self.tokens_per_doc.append(ch.rec_tokens.astype(np.int32))


@dataclass(kw_only=True)
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
        return cls(id=ch.ids[0], ids=ids, mask=mask)


@dataclass(kw_only=True)
class BatchTotals:
    """Counts of one input batch over its task results, in task order; saved with the shards (`to_json`) so a
    later run that appends batches reports the whole dataset without reading this batch again."""

    training_type: str
    docs_in: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    splits: dict[str, SplitTotals] = field(default_factory=lambda: {s: SplitTotals() for s in SPLITS})
    # the records the training type cannot render; the batch's first SAMPLES_PER_REASON of each reason with text
    rejected: list[dict] = field(default_factory=list)
    first: FirstRecord | None = None
    sample: dict | None = None  # the first train record, decoded (set by `finish`)
    samples: ReasonSamples = field(default_factory=ReasonSamples)  # while tasks are added: the entries with text
    languages: dict[str, list[int]] = field(default_factory=dict)  # meta.language -> [records, tokens]

    def add(self, result: TaskResult) -> None:
        self.docs_in += result.docs_in
        for r, c in result.reasons.items():
            self.reasons[r] = self.reasons.get(r, 0) + c
        for entry in result.rejected:  # each task kept its own first texts; the batch's first are among them
            if "text" in entry and not self.samples.add(entry["reason"], entry["id"]):
                entry = {k: v for k, v in entry.items() if k not in ("text", "text_chars")}
            self.rejected.append(entry)
        for language, (records, tokens) in result.languages.items():
            figures = self.languages.setdefault(language, [0, 0])
            figures[0] += records
            figures[1] += tokens
        for s, ch in result.splits.items():
            self.splits[s].add(ch)
            if self.first is None and s == "train" and ch.records:
                self.first = FirstRecord.of(ch, self.training_type)

    def finish(self, enc: Encoder) -> None:
        if self.first is not None:
            self.sample = {
                "id": self.first.id,
                "tokens": int(len(self.first.ids)),
                "markdown": sample_markdown(enc.tok, self.first.ids, self.first.mask),
            }

    def take_off(self, removed: TaskResult, kept: dict[str, np.ndarray], reason: str) -> None:
        """The batch without the records a takedown removed: `removed` is their encoding alone (encode_task, its
        `splits` read), `kept[s]` which of the batch's records of split s stay, in order. They count as dropped for
        `reason`, so docs_in = docs_out + dropped still holds."""
        token_counts = self.token_counts()
        for s, ch in removed.splits.items():
            t = self.splits[s]
            t.records -= ch.records
            for name in SPLIT_COUNTS:
                setattr(t, name, getattr(t, name) - getattr(ch, name))
            t.tokens_per_doc = [token_counts[s][kept[s]]]
            self.reasons[reason] = self.reasons.get(reason, 0) + ch.records
        for language, (records, tokens) in removed.languages.items():
            figures = self.languages[language]
            figures[0] -= records
            figures[1] -= tokens
            if not figures[0]:
                del self.languages[language]

    @property
    def docs_out(self) -> int:
        return sum(t.records for t in self.splits.values())

    def tokens_per_doc(self) -> np.ndarray:
        return np.concatenate([a for t in self.splits.values() for a in t.tokens_per_doc] or [np.zeros(0, np.int32)])

    def counts(self) -> dict:
        """docs_in, docs_out, dropped_<reason> and tokens of the batch (the stats' `batches` entries)."""
        return {
            "docs_in": self.docs_in,
            "docs_out": self.docs_out,
            **{f"dropped_{r}": c for r, c in sorted(self.reasons.items())},
            "tokens": int(self.tokens_per_doc().sum()),
        }

    def to_json(self) -> dict:
        """The counts, without the tokens of each record (`token_counts`: a binary file, as a JSON list they would
        cost the run process ~40 bytes per record)."""
        splits = {s: {a: getattr(t, a) for a in ("records", *SPLIT_COUNTS)} for s, t in self.splits.items()}
        return {
            "training_type": self.training_type,
            "docs_in": self.docs_in,
            "reasons": self.reasons,
            "splits": splits,
            "sample": self.sample,
            "rejected": self.rejected,
            "languages": dict(sorted(self.languages.items())),
        }

    def token_counts(self) -> dict[str, np.ndarray]:
        """Per split, the tokens of each record (int32), in order."""
        return {
            s: np.concatenate(t.tokens_per_doc) if t.tokens_per_doc else np.zeros(0, np.int32)
            for s, t in self.splits.items()
        }

    @classmethod
    def from_json(cls, data: dict, token_counts: dict[str, np.ndarray]) -> BatchTotals:
        """The totals `to_json` and `token_counts` saved (a summary written before the counts had their own file
        holds them as `tokens_per_doc` lists)."""
        splits = {}
        for s, d in data["splits"].items():
            tpd = np.asarray(d["tokens_per_doc"] if "tokens_per_doc" in d else token_counts[s], dtype=np.int32)
            splits[s] = SplitTotals(**{k: v for k, v in d.items() if k != "tokens_per_doc"}, tokens_per_doc=[tpd])
        return cls(
            training_type=data["training_type"],
            docs_in=data["docs_in"],
            reasons=data["reasons"],
            splits=splits,
            rejected=data["rejected"],
            sample=data["sample"],
            languages=data.get("languages", {}),  # absent from totals written before languages were counted
        )


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


def val_warning(settings: ShardSettings, val_records: int, records: int) -> str | None:
    """Why val is too small to measure a loss on (None: it is not, or no val split was asked for)."""
    if settings.val_fraction == 0 or val_records >= settings.min_val_records:
        return None
    return (
        f"val holds {val_records:,} of {records:,} records, under min_val_records {settings.min_val_records}: "
        f"its loss is noise; raise val_fraction ({settings.val_fraction}) or add records"
    )


def language_table(batches) -> dict:
    """meta.language -> records and tokens encoded, over the batches, most tokens first."""
    total: dict[str, list[int]] = {}
    for b in batches:
        for language, (records, tokens) in b.languages.items():
            figures = total.setdefault(language, [0, 0])
            figures[0] += records
            figures[1] += tokens
    order = sorted(total.items(), key=lambda kv: (-kv[1][1], kv[0]))
    return {language: {"records": n, "tokens": t} for language, (n, t) in order}


def _share(part: int, whole: int, digits: int = 4) -> float:
    return round(part / whole, digits) if whole else 0.0


@dataclass(frozen=True, kw_only=True)
class TokenizeResult(StageResult):
    """tokenized_bins' published version over every batch it holds: records in, encoded (docs_out) and dropped per
    reason, the training type and why, tokens and their shares, per split and per batch, tokens per record, bytes
    per shard file, the first record decoded; and how the run went (the version published, the batches added, the
    versions retention removed)."""

    rejected_samples: dict[str, list[dict]]
    training_type: str
    training_type_setting: str
    training_type_reason: str
    settings: dict
    vocab_size: int
    token_dtype: str
    records: int
    tokens: int
    supervised_tokens: int
    masked_tokens: int
    supervised_share: float
    masked_share: float
    metadata_dropout: int
    metadata_dropout_share: float
    no_metadata: int
    records_with_metadata: int
    chars_per_token: float | None = None  # None: no text tokens
    isolated_punctuation_tokens: int
    isolated_punctuation_share: float
    bytes_on_disk: dict[str, int]  # per shard file name
    tokens_per_doc: dict  # mean, p50, p90, p99, max, histogram
    batches: dict[str, dict]  # per input batch: docs_in, docs_out, dropped_<reason>, tokens
    languages: dict[str, dict[str, int]]  # meta.language -> records, tokens
    train: dict[str, int]  # tokens, records, shards
    train_tokens: int
    train_records: int
    train_shards: int
    val: dict[str, int]
    val_tokens: int
    val_records: int
    val_shards: int
    val_moved: list[str]  # records moved from train so val is not empty
    val_warning: str | None = None  # why val is too small to measure a loss on
    sample: dict | None = None  # the first train record, decoded
    version: int
    generation: int
    tokens_per_second: float = run_fact()
    workers: int = run_fact()
    tasks: int = run_fact()
    new_version: bool = run_fact()
    rebuild_reason: str | None = run_fact(default=None)  # None: appended to the latest version
    batches_added: list[str] = run_fact()
    versions: list[int] = run_fact()  # the versions on disk after retention
    versions_removed: list = run_fact()


def stage_result(
    settings: ShardSettings,
    batches: dict[str, BatchTotals],
    manifests: dict[str, dict],
    *,
    vocab_size: int,
    token_dtype: np.dtype,
    seconds: float,
    choice: TrainingTypeChoice,
    **run_facts: Any,
) -> TokenizeResult:
    """The result of the published version whose split manifests are `manifests`, holding `batches` (in order);
    `run_facts` are the TokenizeResult fields that say how the run went (version, workers, tasks, ...)."""
    token_figures = _token_figures(manifests)
    records, tokens = token_figures["records"], token_figures["tokens"]
    splits = _split_figures(manifests)
    return TokenizeResult(
        **_drop_figures(batches.values(), records),
        training_type=choice.resolved,
        training_type_setting=choice.setting,
        training_type_reason=choice.reason,
        settings=settings.model_dump(),
        vocab_size=vocab_size,
        token_dtype=token_dtype.name,
        **token_figures,
        **_text_figures(batches.values(), records, tokens, choice),
        bytes_on_disk=_bytes_on_disk(manifests),
        tokens_per_doc=_tokens_per_doc(batches.values()),
        batches={key: b.counts() for key, b in batches.items()},
        languages=language_table(batches.values()),
        seconds=round(seconds, 3),
        tokens_per_second=round(tokens / seconds, 1) if seconds else 0.0,
        **splits,
        val_moved=manifests["val"].get(VAL_MOVED_KEY, []),
        val_warning=val_warning(settings, splits["val_records"], records),
        sample=next((b.sample for b in batches.values() if b.sample is not None), None),
        **run_facts,
    )


def _drop_figures(batches: Collection[BatchTotals], records: int) -> dict:
    """docs_in, docs_out and dropped over the batches, with the first rejected records with text per reason."""
    reasons: dict[str, int] = {}
    samples = ReasonSamples()
    for b in batches:
        for r, c in b.reasons.items():
            reasons[r] = reasons.get(r, 0) + c
        for e in b.rejected:
            if "text" in e:
                samples.add(e["reason"], e)
    return {
        "docs_in": sum(b.docs_in for b in batches),
        "docs_out": records,
        "dropped": dict(sorted(reasons.items())),
        "rejected_samples": samples.as_dict(),
    }


def _token_figures(manifests: dict[str, dict]) -> dict:
    """Records, tokens, supervised and masked tokens and their shares, over the splits' manifest totals."""
    split_totals = [m["totals"] for m in manifests.values()]
    tokens = sum(t["tokens"] for t in split_totals)
    records = sum(t["records"] for t in split_totals)
    supervised = sum(t["supervised_tokens"] for t in split_totals)
    return {
        "records": records,
        "tokens": tokens,
        "supervised_tokens": supervised,
        "masked_tokens": tokens - supervised,
        "supervised_share": _share(supervised, tokens),
        "masked_share": _share(tokens - supervised, tokens),
    }


def _text_figures(batches: Iterable[BatchTotals], records: int, tokens: int, choice: TrainingTypeChoice) -> dict:
    """Metadata dropout, records with metadata, chars per token and isolated punctuation, over the batches."""
    per_split = [t for b in batches for t in b.splits.values()]
    text_chars = sum(t.text_chars for t in per_split)
    text_tokens = sum(t.text_tokens for t in per_split)
    punct = sum(t.punct for t in per_split)
    dropout = sum(t.dropout for t in per_split)
    no_metadata = sum(t.no_metadata for t in per_split)
    return {
        "metadata_dropout": dropout,
        "metadata_dropout_share": _share(dropout, records),
        "no_metadata": no_metadata,
        "records_with_metadata": records - no_metadata - dropout if choice.resolved == "conditional" else 0,
        "chars_per_token": round(text_chars / text_tokens, 4) if text_tokens else None,
        "isolated_punctuation_tokens": punct,
        "isolated_punctuation_share": _share(punct, tokens, 5),
    }


def _bytes_on_disk(manifests: dict[str, dict]) -> dict[str, int]:
    """Bytes per shard file name, over every shard of every split."""
    total: dict[str, int] = {}
    for m in manifests.values():
        for sh in m["shards"]:
            for fname, info in sh["files"].items():
                total[fname] = total.get(fname, 0) + info["bytes"]
    return total


def _tokens_per_doc(batches: Iterable[BatchTotals]) -> dict:
    """Mean, percentiles, max and histogram of the tokens per record."""
    tpd = np.concatenate([b.tokens_per_doc() for b in batches] or [np.zeros(0, np.int32)])
    return {
        "mean": round(float(tpd.mean()), 2) if tpd.size else 0.0,
        **{f"p{q}": int(np.percentile(tpd, q)) if tpd.size else 0 for q in (50, 90, 99)},
        "max": int(tpd.max()) if tpd.size else 0,
        "histogram": histogram(tpd),
    }


def _split_figures(manifests: dict[str, dict]) -> dict:
    """Per split: <split>_tokens, <split>_records, <split>_shards, and the three under <split>."""
    figures: dict = {}
    for s in SPLITS:
        t = manifests[s]["totals"]
        figures[f"{s}_tokens"], figures[f"{s}_records"] = t["tokens"], t["records"]
        figures[f"{s}_shards"] = len(manifests[s]["shards"])
        figures[s] = {"tokens": t["tokens"], "records": t["records"], "shards": figures[f"{s}_shards"]}
    return figures
