"""`tokenmill forget`: a takedown. The records named by id, by source path or by a regex over their text (and, with
`--with-duplicates`, those dedup folded into them) leave tokenized_bins in its next version, and every export
already materialized, and funnel_telemetry, is written again from that version.

Under the data root's lock (one writer at a time, as `tokenmill update` takes it), in order: the selector is
resolved over deduped_jsonl's batches of the published version (streamed, part file by part file; `--id` by a byte
search for the ids), the takedown list gets the records' ids and text keys (tokenize/forgotten.py: later batches
with the same text stay out), the version without them is published (tokenize/takedown.py), then the exports and
the funnel are rewritten. A selector that names nothing in the published version publishes nothing.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from tokenmill.common.io import (
    REMOVED_FILE,
    atomic_write_json,
    batch_folders,
    iter_jsonl,
    read_json,
    record_shards,
    staged_output,
)
from tokenmill.common.lock import DataRootLock
from tokenmill.errors import CorruptOutputError, TokenmillError
from tokenmill.exports import hf_parquet, megatron, nanogpt
from tokenmill.settings import number_from_env
from tokenmill.stages.funnel_chart import funnel_chart_svg
from tokenmill.stages.telemetry import build_funnel
from tokenmill.stages.tokenize.forgotten import record_text, text_key
from tokenmill.stages.tokenize.summary import TokenizeResult
from tokenmill.stages.tokenize.takedown import Takedown, forget_records, locate
from tokenmill.stages.tokenize.verify import find_records
from tokenmill.stages.tokenize.versions import recover
from tokenmill_loader.format import SPLITS, manifest_path

EXPORTS = ("nanogpt_bins", "megatron_indexed", "hf_parquet")  # the export assets' folders (assets/exports.py)
FUNNEL_DIR = "funnel_telemetry"


class NothingToForget(TokenmillError, ValueError):
    """A takedown's selector names no record of the published version (or names an id it does not hold)."""


@dataclass(frozen=True, kw_only=True)
class Selector:
    """Which records a takedown removes: ids, source paths (a file, or every file under a folder) or a regex over
    the text; one kind per takedown."""

    ids: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    match: str | None = None
    with_duplicates: bool = False  # also the records dedup folded into the selected ones

    def manifest_entry(self) -> dict:
        given: dict = {"id": list(self.ids)} if self.ids else {"source": list(self.sources)} if self.sources else {}
        return {
            **given,
            **({"match": self.match} if self.match is not None else {}),
            "with_duplicates": self.with_duplicates,
        }

    def selects(self, rec: dict) -> bool:
        """Whether a record of deduped_jsonl is selected by its source path or its text (ids: find_records)."""
        if self.sources:
            path = str((rec.get("source") or {}).get("path", ""))
            return any(path == s or path.startswith(s.rstrip("/") + "/") for s in self.sources)
        return self.match is not None and re.search(self.match, record_text(rec)) is not None


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a takedown published: the version and its result, the records removed, the duplicates forgotten with
    them, and what was written again from the version."""

    result: TokenizeResult
    removed: list[str]
    duplicates: list[str]
    rewritten: list[str]  # the exports and funnel_telemetry, written again from the new version


def _records(folders: list[Path]) -> Iterator[dict]:
    for part in (p for folder in folders for p in record_shards(folder)):
        yield from iter_jsonl(part)


def selected_records(folders: list[Path], selector: Selector) -> dict[str, dict]:
    """id -> record of deduped_jsonl (the batch folders `folders`) the selector names; streamed."""
    if selector.ids:
        return find_records(folders, set(selector.ids))
    return {rec["id"]: rec for rec in _records(folders) if selector.selects(rec)}


def folded_duplicates(deduped_dir: Path, ids: set[str]) -> dict[str, dict]:
    """id -> removed.jsonl entry (with its text) of every record dedup folded into one of `ids`, or into one of
    those, and so on: each pass streams the removed.jsonl files once, until a pass finds nothing new."""
    found: dict[str, dict] = {}
    targets = set(ids)
    while targets:
        new = {
            e["id"]: e
            for folder in batch_folders(deduped_dir)
            for e in iter_jsonl(folder / REMOVED_FILE)
            if (folder / REMOVED_FILE).is_file() and e.get("duplicate_of") in targets and e["id"] not in found
        }
        found.update(new)
        targets = set(new)
    return found


def plan_takedown(data_root: Path, selector: Selector, reason: str | None, by: str | None) -> Takedown:
    """The takedown of what `selector` names in the published version; NothingToForget if it names nothing there
    (or an --id the version lacks)."""
    bins, deduped = data_root / "tokenized_bins", data_root / "deduped_jsonl"
    latest = read_json(manifest_path(bins / SPLITS[0]))
    folders = [deduped / b for b in latest["batches"]]
    matched = selected_records(folders, selector)
    in_version = locate(bins, set(matched))
    if missing := [i for i in selector.ids if i not in in_version]:
        raise NothingToForget(f"version {latest['version']} of {bins} holds no record {', '.join(missing)}")
    if not in_version:
        raise NothingToForget(f"{_describe(selector)} matches no record of version {latest['version']} of {bins}")
    duplicates = folded_duplicates(deduped, set(in_version)) if selector.with_duplicates else {}
    return Takedown(
        records=frozenset(in_version),
        duplicates=tuple(sorted(duplicates)),
        # a selected record the version does not hold (tokenize could not render it) is kept out all the same
        keys={rid: text_key(rec) for rid, rec in {**matched, **duplicates}.items()},
        selector=selector.manifest_entry(),
        reason=reason,
        by=by,
        at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _describe(selector: Selector) -> str:
    if selector.sources:
        return f"--source {' '.join(selector.sources)}"
    return f"--match {selector.match!r}" if selector.match is not None else f"--id {' '.join(selector.ids)}"


def forget(data_root: Path, selector: Selector, reason: str | None = None, by: str | None = None, log=None) -> Outcome:
    """The takedown, under the data root's lock (TOKENMILL_LOCK_WAIT: seconds to wait for a running update)."""
    data_root = Path(data_root)
    with DataRootLock(data_root).acquire("tokenmill forget", number_from_env("TOKENMILL_LOCK_WAIT", 0.0)):
        recover(data_root / "tokenized_bins", log)  # what a killed run left, before the published version is read
        takedown = plan_takedown(data_root, selector, reason, by)
        result = forget_records(data_root / "tokenized_bins", data_root / "deduped_jsonl", takedown, log)
        rewritten = rewrite_exports(data_root) + rewrite_funnel(data_root)
    return Outcome(
        result=result, removed=sorted(takedown.records), duplicates=list(takedown.duplicates), rewritten=rewritten
    )


def rewrite_exports(data_root: Path) -> list[str]:
    """Every export already materialized, written again from the latest version by its own function (as its
    asset would, with the default settings; the Dagster catalog shows the earlier materialization until the asset
    is materialized again); hf_parquet's records/ leave out the forgotten records as every run of it does."""
    bins = data_root / "tokenized_bins"
    written = []
    for name in EXPORTS:
        if not (data_root / name).exists():
            continue
        with staged_output(data_root / name) as out:
            if name == "nanogpt_bins":
                nanogpt.write_nanogpt(bins, out)
            elif name == "megatron_indexed":
                megatron.write_megatron(bins, out)
            else:
                hf_parquet.write_hf_parquet(data_root / "deduped_jsonl", bins, out, hf_parquet.ParquetSettings())
        written.append(name)
    return written


def rewrite_funnel(data_root: Path) -> list[str]:
    """funnel_telemetry's funnel.json and funnel.svg written again from the stages' figures, as its asset does (the
    chart without the earlier materializations' counts, which only the Dagster instance holds, until the asset runs
    again), so `tokenmill update`'s summary shows the takedown; [] when it was never materialized."""
    folder = data_root / FUNNEL_DIR
    if not folder.exists():
        return []
    funnel = build_funnel(data_root)
    if not funnel.conserved:
        raise CorruptOutputError(f"{data_root}: the stages' _stats.json no longer conserve records; funnel kept")
    with staged_output(folder) as out:
        atomic_write_json(out / "funnel.json", funnel.to_json())
        funnel_chart_svg(funnel, [], out / "funnel.svg")
    return [FUNNEL_DIR]


def forget_command(args) -> int:
    """`tokenmill forget` (cli.py's arguments): a few lines saying what was published; a selector naming nothing,
    a bad regex or a busy data root is one line on stderr and exit status 2, with nothing published."""
    selector = Selector(
        ids=tuple(args.id), sources=tuple(args.source), match=args.match, with_duplicates=args.with_duplicates
    )
    try:
        if selector.match is not None:
            re.compile(selector.match)
        outcome = forget(Path(args.data), selector, args.reason, args.by)
    except re.error as e:
        print(f"tokenmill forget: --match {args.match!r}: {e}", file=sys.stderr)
        return 2
    except (TokenmillError, OSError) as e:
        print(f"tokenmill forget: {e}", file=sys.stderr)
        return 2
    result = outcome.result
    print(
        f"forgot {_count(len(outcome.removed), 'record')} ({result.dropped.get('forgotten', 0):,} forgotten in all): "
        f"tokenized_bins version {result.version}, {result.records:,} records, {result.tokens:,} tokens"
    )
    if outcome.duplicates:
        print(
            f"  with {_count(len(outcome.duplicates), 'duplicate')} dedup folded into them (kept out of later batches)"
        )
    print(f"  written again from it: {', '.join(outcome.rewritten) or 'nothing (no export materialized)'}")
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
