"""Pass 3, the quality-model step (only with `quality_model` set): every record pass 2 wrote is scored by the model,
the keep rule (`quality_threshold`, or `quality_keep_share` of the batch or of each language) picks the records to
keep, and each shard is rewritten with meta.quality_score and meta.quality_model on its records, the others going to
its rejected side file with reason "quality_score", their score, the cutoff, the rule and the model as evidence.

Scores are stored per model (its files' hash and `quality_max_tokens`) and record (its id and text), so a changed
rule re-runs no model and an unchanged record is never scored twice; a changed model or text is scored again.
The store keeps what some batch in the stage folder uses: each batch lists its files (`store_files`), and the
others (another model's, a rebuilt batch's) are removed once the step is done, so it never outgrows the batches.
Beside them, a fastText model's linear form (<model id>.linear-v1.npz): a process that finds it never loads the model.

  score   one task per shard: the shard's records looked up in the score store, the others scored, the store
          written; returns the shard's scores, languages and per-source sums
  rule    in the driver, over the batch's scores: a keep mask per shard (ties at a share's cutoff broken by id)
  select  one task per shard: the shard rewritten, the drops appended to its rejected side file
"""

from __future__ import annotations

import hashlib
import math
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tokenmill.common.io import STATS_FILE, atomic_file, dumps, line_ids, loads, read_json
from tokenmill.common.parallel import map_ordered
from tokenmill.common.progress import Progress
from tokenmill.common.samples import ReasonSamples, cut_text, with_text
from tokenmill.stages.clean.prepare import coerce_text
from tokenmill.stages.clean.quality.settings import UNKNOWN_LANGUAGE
from tokenmill.stages.clean.quality.text import language_code
from tokenmill.stages.clean.settings import CleanSettings
from tokenmill.stages.clean.staging import rejected_line
from tokenmill.stages.quality_model import QualityModel, load_quality_model, model_id, model_kind

QUALITY_SCORE_REASON = "quality_score"
SCORE_STORE = "_quality_scores"
"""The score store's folder in the stage folder: <model id>-t<max tokens>/<CRC-32>-<bytes>.npy, one file per shard
pass 2 wrote, named by its contents: the same shard in a rebuild, a re-run or another batch finds its scores."""
LINEAR_FORM_SUFFIX = ".linear-v1.npz"
"""<model id> + this in the score store: the model's linear form (fasttext_linear.LinearFastText.save)."""
SCORE_DIGITS = 4
"""Scores are rounded to this many decimals, in meta and for the rule alike (and CPU and GPU agree to it)."""
SCORE_BATCH = 256
"""Texts per call of the model."""
HISTOGRAM_BINS = 20
EXTREMES = 5
"""Lowest-scored kept and highest-scored dropped records shown."""
TOP_SOURCES = 20
if TYPE_CHECKING:
    from tokenmill.stages.clean.corpus import Totals

_STORE_DTYPE = np.dtype([("key", "<u8"), ("score", "<f4")])

_loaded: dict[tuple[str, str, str, int], QualityModel] = {}  # one model per process, loaded on its first task


def loaded_model(model: ModelStep, linear_cache: Path) -> QualityModel:
    key = (model.path, model.model_id, model.device, model.max_tokens)
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_quality_model(
            model.path,
            device=model.device,
            max_tokens=model.max_tokens,
            known_id=model.model_id,
            linear_cache=linear_cache,
        )
    return _loaded[key]


def record_key(record_id, text: str) -> int:
    """The score store's key of a record: its id and text, hashed (8 bytes of BLAKE2b)."""
    digest = hashlib.blake2b(f"{record_id}\0{text}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rounded(scores: np.ndarray) -> list[float]:
    return [round(float(x), SCORE_DIGITS) for x in scores]


@dataclass(frozen=True, kw_only=True)
class ModelStep:
    """The model of a run, as its tasks need it: known before any task loads it."""

    path: str
    kind: str
    model_id: str
    device: str
    max_tokens: int

    @classmethod
    def of(cls, s: CleanSettings) -> ModelStep:
        path = Path(s.quality_model).expanduser()
        kind = model_kind(path)  # a missing or unreadable model: one ConfigError line before any pass
        return cls(
            path=str(path),
            kind=kind,
            model_id=model_id(path),
            device=s.quality_model_device,
            max_tokens=s.quality_max_tokens,
        )

    def store(self, stage_folder: Path, shard: dict) -> Path:
        """The store file of a shard (its SHARDS_FILE entry: bytes, crc32)."""
        name = f"{shard['crc32']:08x}-{shard['bytes']}.npy"
        return stage_folder / SCORE_STORE / f"{self.model_id}-t{self.max_tokens}" / name

    def linear_cache(self, stage_folder: Path) -> Path:
        """Where a fastText model's linear form is kept for the stage's processes (a few bytes per model row)."""
        return stage_folder / SCORE_STORE / f"{self.model_id}{LINEAR_FORM_SUFFIX}"


def prune_score_store(stage_folder: Path, in_use: list[str]) -> int:
    """Removes the store files (paths relative to the store) that neither `in_use` nor any batch's `_stats.json` in
    the stage folder lists; returns how many. A file a concurrent batch has written but not yet listed may go too:
    that only costs it a scoring later (the store is a cache), and files being written (hidden) are never touched."""
    store = stage_folder / SCORE_STORE
    listed = set(in_use)
    for batch in stage_folder.iterdir():
        if batch.name.startswith((".", "_")) or not (batch / STATS_FILE).is_file():
            continue
        try:
            listed.update((read_json(batch / STATS_FILE).get("quality_model") or {}).get("store_files", []))
        except ValueError:  # a damaged stats file lists nothing: the files it listed are scored again if needed
            continue
    removed = 0
    for path in sorted(store.glob("*/*.npy")):
        if path.relative_to(store).as_posix() not in listed:
            path.unlink(missing_ok=True)
            removed += 1
    for folder in store.iterdir() if store.is_dir() else ():
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    models = {folder.name.rsplit("-t", 1)[0] for folder in store.iterdir() if folder.is_dir()} if store.is_dir() else ()
    for form in store.glob(f"*{LINEAR_FORM_SUFFIX}"):
        if form.name.removesuffix(LINEAR_FORM_SUFFIX) not in models:  # no batch uses its model's scores any more
            form.unlink(missing_ok=True)
    return removed


@dataclass(frozen=True, kw_only=True)
class ScoreTask:
    part: str
    """The shard pass 2 wrote."""
    store: str
    """Its score store file (.npy of key, score sorted by key), read when present and written anew."""
    model: ModelStep
    linear_cache: str


@dataclass(kw_only=True)
class ShardScores:
    scores: np.ndarray
    """float64, rounded to SCORE_DIGITS, one per record in shard order."""
    language_names: list[str]
    languages: np.ndarray
    """Each record's index into language_names (meta.language, else UNKNOWN_LANGUAGE)."""
    sources: dict[str, list[float]]
    """source path -> [records, sum of scores]."""
    reused: int
    """Records whose score the store held."""


def _read_store(path: Path) -> np.ndarray:
    """The stored scores of a shard; none when the file is missing or unreadable (its records are scored again and
    the file written anew: a store is a cache, never the only copy of anything)."""
    try:
        store = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return np.zeros(0, _STORE_DTYPE)
    return store if store.dtype == _STORE_DTYPE else np.zeros(0, _STORE_DTYPE)


def score_task(task: ScoreTask) -> ShardScores:
    """The shard's scores: the store's where it has the record, the model's for the others."""
    keys: list[int] = []
    texts: list[str] = []
    names: dict[str, int] = {}
    language_of: list[int] = []
    sources: list[str] = []
    with open(task.part, "rb") as f:
        for line in f:
            rec = loads(line)
            text = coerce_text(rec.get("text"))
            meta = rec.get("meta") if isinstance(rec.get("meta"), dict) else {}
            language = language_code(meta) or UNKNOWN_LANGUAGE
            language_of.append(names.setdefault(language, len(names)))
            source = rec.get("source")
            sources.append(str(source.get("path")) if isinstance(source, dict) else "")
            keys.append(record_key(rec.get("id"), text))
            texts.append(text)
    key_array = np.array(keys, dtype=np.uint64)
    raw = np.zeros(len(keys), np.float32)
    store = _read_store(Path(task.store))
    found = np.zeros(len(keys), bool)
    if len(store) and len(keys):
        at = np.minimum(np.searchsorted(store["key"], key_array), len(store) - 1)
        found = store["key"][at] == key_array
        raw[found] = store["score"][at[found]]
    missing = np.flatnonzero(~found)
    if len(missing):  # the store file is the shard's alone (named by its bytes): rewritten whole
        model = loaded_model(task.model, Path(task.linear_cache))
        for start in range(0, len(missing), SCORE_BATCH):
            chunk = missing[start : start + SCORE_BATCH]
            raw[chunk] = model.score([texts[i] for i in chunk])
        order = np.argsort(key_array, kind="stable")
        entries = np.zeros(len(keys), _STORE_DTYPE)
        entries["key"], entries["score"] = key_array[order], raw[order]
        Path(task.store).parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(task.store, "wb") as out:
            np.save(out, entries, allow_pickle=False)
    scores = np.array(rounded(raw), dtype=np.float64)
    by_source: dict[str, list[float]] = {}
    for source, score in zip(sources, scores.tolist()):
        figures = by_source.setdefault(source, [0, 0.0])
        figures[0] += 1
        figures[1] += score
    return ShardScores(
        scores=scores,
        language_names=list(names),
        languages=np.array(language_of, dtype=np.int32),
        sources=by_source,
        reused=int(found.sum()),
    )


@dataclass(frozen=True, kw_only=True)
class Cutoff:
    """Where a group's rule cut: records scoring above `score` kept, at it kept when `at_score_kept` (None: all)."""

    group: str
    """The language, or "" for the whole batch."""
    score: float
    rule: str


def keep_share_mask(
    scores: np.ndarray, ids_at, share: float, group: str, rule: str
) -> tuple[np.ndarray, Cutoff | None]:
    """The top round(share x n) of `scores` (ties at the cutoff by smallest record id: `ids_at(indexes)` reads
    them); the cutoff, None when every record is kept."""
    n = len(scores)
    k = math.floor(share * n + 0.5)
    if k >= n:
        return np.ones(n, bool), None
    if k == 0:
        return np.zeros(n, bool), Cutoff(group=group, score=float(scores.max()), rule=rule)
    cut = float(-np.partition(-scores, k - 1)[k - 1])
    keep = scores > cut
    tied = np.flatnonzero(scores == cut)
    wanted = k - int(keep.sum())
    if wanted == len(tied):
        keep[tied] = True
    else:
        ids = ids_at(tied)
        order = sorted(range(len(tied)), key=lambda j: str(ids[j]))
        keep[tied[order[:wanted]]] = True
    return keep, Cutoff(group=group, score=cut, rule=rule)


@dataclass(frozen=True, kw_only=True)
class SelectTask:
    part: str
    rejected: str
    """The shard's rejected side file: the drops are appended."""
    keep: np.ndarray
    scores: np.ndarray
    cutoffs: dict[str, Cutoff]
    """group -> its cutoff: "" for the batch, a language when per language."""
    per_language: bool
    model_id: str
    shown: tuple[int, ...]
    """Records (shard line numbers) whose text the extremes table shows."""


@dataclass(kw_only=True)
class SelectResult:
    size: int
    crc32: int
    docs_out: int
    ids: np.ndarray | None
    dropped_lengths: list[int]
    dropped_languages: Counter[str]
    """language -> records dropped (by meta.language)."""
    dropped_chars_by_language: Counter[str]
    samples: dict
    """reason -> [(line in the rejected side file, entry with its text)]."""
    texts: dict[int, dict]
    """Line number -> {id, text (cut), source} of the records asked for in `shown`."""


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))


def select_task(task: SelectTask) -> SelectResult:
    """The shard rewritten with the kept records (their score and the model in meta), the drops appended to the
    rejected side file."""
    samples = ReasonSamples()
    rejected_at = _count_lines(task.rejected)
    kept_lines: list[bytes] = []
    result = SelectResult(
        size=0,
        crc32=0,
        docs_out=0,
        ids=None,
        dropped_lengths=[],
        dropped_languages=Counter(),
        dropped_chars_by_language=Counter(),
        samples={},
        texts={},
    )
    shown = set(task.shown)
    with open(task.part, "rb") as f, open(task.rejected, "ab") as rej:
        for i, line in enumerate(f):
            rec = loads(line)
            score = float(task.scores[i])
            text = coerce_text(rec.get("text"))
            if i in shown:
                result.texts[i] = {"id": rec.get("id"), "text": cut_text(text), "source": rec.get("source")}
            if not isinstance(rec.get("meta"), dict):
                rec["meta"] = {}
            if task.keep[i]:
                rec["meta"]["quality_score"] = score
                rec["meta"]["quality_model"] = task.model_id
                kept_lines.append(dumps(rec).encode("utf-8"))
                continue
            language = language_code(rec["meta"]) or UNKNOWN_LANGUAGE
            cutoff = task.cutoffs[language if task.per_language else ""]
            evidence = {"value": score, "threshold": cutoff.score, "rule": cutoff.rule, "model": task.model_id}
            detail = f"quality score {score} below the cutoff {cutoff.score} ({cutoff.rule})"
            if cutoff.score <= score:  # a tie at a share's cutoff, lost on its record id
                detail = f"quality score {score} at the cutoff ({cutoff.rule}), after records of smaller id"
            entry_line = rejected_line(rec, (QUALITY_SCORE_REASON, detail, evidence))
            rej.write(entry_line + b"\n")
            if samples.wants(QUALITY_SCORE_REASON):
                samples.add(QUALITY_SCORE_REASON, (rejected_at, with_text(loads(entry_line), text)))
            rejected_at += 1
            result.dropped_lengths.append(len(text))
            result.dropped_languages[language] += 1
            result.dropped_chars_by_language[language] += len(text)
    data = b"\n".join(kept_lines) + b"\n" if kept_lines else b""
    with atomic_file(task.part, "wb") as out:
        out.write(data)
    result.size, result.crc32, result.docs_out = len(data), zlib.crc32(data), len(kept_lines)
    result.ids = line_ids(kept_lines) if kept_lines else np.zeros(0, np.uint64)
    result.samples = samples.by_reason
    return result


def ids_reader(parts: list[str], offsets: np.ndarray):
    """ids_at(batch indexes) -> their record ids, read from the shards (only for ties at a share's cutoff)."""

    def ids_at(indexes: np.ndarray) -> list:
        wanted: dict[int, dict[int, int]] = {}
        for j, index in enumerate(indexes.tolist()):
            shard = int(np.searchsorted(offsets, index, side="right")) - 1
            wanted.setdefault(shard, {})[index - int(offsets[shard])] = j
        ids: list = [None] * len(indexes)
        for shard, lines in wanted.items():
            with open(parts[shard], "rb") as f:
                for i, line in enumerate(f):
                    if i in lines:
                        ids[lines[i]] = loads(line).get("id")
        return ids

    return ids_at


def keep_masks(
    s: CleanSettings, scores: np.ndarray, languages: np.ndarray, language_names: list[str], ids_at
) -> tuple[np.ndarray, dict[str, Cutoff]]:
    """The batch's keep mask under the rule, and each group's cutoff."""
    if s.quality_threshold is not None:
        rule = f"quality_threshold {s.quality_threshold}"
        return scores >= s.quality_threshold, {"": Cutoff(group="", score=s.quality_threshold, rule=rule)}
    if s.quality_keep_share is None:
        return np.ones(len(scores), bool), {}
    share = s.quality_keep_share
    if not s.quality_per_language:
        keep, cutoff = keep_share_mask(scores, ids_at, share, "", f"quality_keep_share {share} of the batch")
        return keep, {"": cutoff} if cutoff else {}
    keep = np.zeros(len(scores), bool)
    cutoffs = {}
    for code, name in enumerate(language_names):
        members = np.flatnonzero(languages == code)
        rule = f"quality_keep_share {share} of the batch's {name} records"
        group_ids = lambda ix, members=members: ids_at(members[ix])  # noqa: E731
        group_keep, cutoff = keep_share_mask(scores[members], group_ids, share, name, rule)
        keep[members[group_keep]] = True
        if cutoff:
            cutoffs[name] = cutoff
    return keep, cutoffs


@dataclass(kw_only=True)
class BatchScores:
    """The shards' ShardScores joined, languages renumbered over the batch."""

    scores: np.ndarray
    languages: np.ndarray
    language_names: list[str]
    offsets: np.ndarray
    """Each shard's first record in the batch's order, and the total last."""
    sources: dict[str, list[float]] = field(default_factory=dict)
    reused: int = 0

    @classmethod
    def join(cls, shards: list[ShardScores]) -> BatchScores:
        names: dict[str, int] = {}
        languages: list[np.ndarray] = []
        sources: dict[str, list[float]] = {}
        reused = 0
        for shard in shards:
            remap = np.array([names.setdefault(n, len(names)) for n in shard.language_names] or [0], np.int32)
            languages.append(remap[shard.languages] if len(shard.languages) else shard.languages)
            for source, (n, total) in shard.sources.items():
                figures = sources.setdefault(source, [0, 0.0])
                figures[0] += n
                figures[1] += total
            reused += shard.reused
        sizes = [len(shard.scores) for shard in shards]
        return cls(
            scores=np.concatenate([shard.scores for shard in shards] or [np.zeros(0)]),
            languages=np.concatenate(languages or [np.zeros(0, np.int32)]),
            language_names=list(names),
            offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
            sources=sources,
            reused=reused,
        )


def extremes(scores: np.ndarray, keep: np.ndarray) -> tuple[list[int], list[int]]:
    """The EXTREMES lowest-scored kept and highest-scored dropped records (batch indexes; ties by position)."""
    kept, dropped = np.flatnonzero(keep), np.flatnonzero(~keep)
    lowest = kept[np.lexsort((kept, scores[kept]))][:EXTREMES]
    highest = dropped[np.lexsort((dropped, -scores[dropped]))][:EXTREMES]
    return lowest.tolist(), highest.tolist()


def score_histogram(scores: np.ndarray, keep: np.ndarray) -> dict:
    """Records per score bin, kept and dropped: bins over 0..1 when every score is in it (probabilities), else
    over the scores' range (a regression head)."""
    probabilities = not len(scores) or (scores.min() >= 0 and scores.max() <= 1)
    lo, hi = (0.0, 1.0) if probabilities else (float(scores.min()), float(scores.max()))
    edges = np.linspace(lo, hi if hi > lo else lo + 1, HISTOGRAM_BINS + 1)
    kept, _ = np.histogram(scores[keep], edges)
    dropped, _ = np.histogram(scores[~keep], edges)
    return {"edges": [round(float(e), SCORE_DIGITS) for e in edges], "kept": kept.tolist(), "dropped": dropped.tolist()}


def mean_by(groups: dict[str, list[float]], limit: int | None = None) -> dict[str, dict]:
    """group -> {records, mean score}, most records first."""
    order = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))[:limit]
    return {g: {"records": int(n), "mean_score": round(total / n, SCORE_DIGITS)} for g, (n, total) in order}


def run_model_step(
    model: ModelStep, paths: list, s: CleanSettings, totals: Totals, workers: int, log, stage_folder: Path
) -> dict:
    """Pass 3 over the shards pass 2 wrote (ShardPaths: .out, .rejected), `totals` brought up to date (records and
    characters out, languages, lengths, shard figures, ids, drops); returns the step's report for _stats.json."""
    t0 = time.perf_counter()
    parts = [str(p.out) for p in paths]
    stores = [str(model.store(stage_folder, shard)) for shard in totals.shards]
    linear_cache = str(model.linear_cache(stage_folder))
    tasks = [
        ScoreTask(part=part, store=store, model=model, linear_cache=linear_cache) for part, store in zip(parts, stores)
    ]
    # a transformers model is one per process (one per GPU): its own threads, or the GPU, run the batch
    score_workers = 1 if model.kind == "transformers" else workers
    progress = Progress("cleaned_jsonl quality model (score)", total=len(tasks), unit="shards", log=log)
    shard_scores = []
    for res in map_ordered(score_task, tasks, score_workers):
        shard_scores.append(res)
        progress.advance(1)
    progress.finish()
    batch_scores = BatchScores.join(shard_scores)
    scores, offsets = batch_scores.scores, batch_scores.offsets
    t_rule = time.perf_counter()
    keep, cutoffs = keep_masks(
        s, scores, batch_scores.languages, batch_scores.language_names, ids_reader(parts, offsets)
    )
    lowest, highest = extremes(scores, keep)
    select = [
        SelectTask(
            part=part,
            rejected=str(p.rejected),
            keep=keep[offsets[k] : offsets[k + 1]],
            scores=scores[offsets[k] : offsets[k + 1]],
            cutoffs=cutoffs,
            per_language=s.quality_per_language,
            model_id=model.model_id,
            shown=tuple(int(i - offsets[k]) for i in (*lowest, *highest) if offsets[k] <= i < offsets[k + 1]),
        )
        for k, (p, part) in enumerate(zip(paths, parts))
    ]
    shown: dict[int, dict] = {}
    for k, (p, selected) in enumerate(zip(paths, map_ordered(select_task, select, workers))):
        totals.add_selected(k, p.out.name, selected)
        shown.update({int(offsets[k]) + i: entry for i, entry in selected.texts.items()})
    totals.seconds["quality_model"] = t_rule - t0
    totals.seconds["quality_select"] = time.perf_counter() - t_rule
    totals.pass_seconds["quality"] = round(time.perf_counter() - t0, 3)
    store_files = sorted({Path(p).relative_to(stage_folder / SCORE_STORE).as_posix() for p in stores})
    pruned = prune_score_store(stage_folder, store_files)
    if pruned and log is not None:
        log.info(f"cleaned_jsonl quality model: {pruned} score store files no batch uses removed")
    by_language = {}
    for code, name in enumerate(batch_scores.language_names):
        members = scores[batch_scores.languages == code]
        by_language[name] = [len(members), float(members.sum())]

    def listed(indexes: list[int]) -> list[dict]:
        return [{**shown[i], "score": float(scores[i])} for i in indexes]

    kept = int(keep.sum())
    return {
        "model": {
            "path": model.path,
            "kind": model.kind,
            "id": model.model_id,
            "device": model.device,
            "max_tokens": model.max_tokens,
        },
        "rule": (
            f"quality_threshold {s.quality_threshold}"
            if s.quality_threshold is not None
            else f"quality_keep_share {s.quality_keep_share}" + (" per language" if s.quality_per_language else "")
            if s.quality_keep_share is not None
            else "none (scores only)"
        ),
        "cutoffs": {group or "batch": cutoff.score for group, cutoff in sorted(cutoffs.items())},
        "scored": len(scores),
        "reused_scores": batch_scores.reused,
        "model_scored": len(scores) - batch_scores.reused,
        "store_files": store_files,
        "store_pruned": pruned,
        "kept": kept,
        "dropped": len(scores) - kept,
        "kept_share": round(kept / len(scores), SCORE_DIGITS) if len(scores) else 1.0,
        "mean_score": round(float(scores.mean()), SCORE_DIGITS) if len(scores) else None,
        "histogram": score_histogram(scores, keep),
        "by_language": mean_by(by_language),
        "by_source": mean_by(batch_scores.sources, TOP_SOURCES),
        "lowest_kept": listed(lowest),
        "highest_dropped": listed(highest),
    }
