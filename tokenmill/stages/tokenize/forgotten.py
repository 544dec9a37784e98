"""The takedown list: records `tokenmill forget` removed, which tokenized_bins keeps out of every later version.

`tokenized_bins/_forgotten.jsonl` holds one line per forgotten record, `{"id", "key", "version", "at"}`: its id
and its text key (the SHA-256 of `text_keys.dedup_key` of the text with dedup's default settings: NFKC,
case-folded, punctuation and spaces removed; dedup's exact key), so an append and a new generation (every batch
encoded again) drop both the record and any later record with the same text, as reason `forgotten` (counted like
every drop). The dedup index itself is not told (a stage does not import another): the exclusion is enforced where
tokenize reads deduped_jsonl (encode.encode_task). The list is written before the version that removes its records:
a list naming a record still published only keeps it out of later versions, where the other order could let a
kill bring a removed record back with the next generation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tokenmill.common.io import atomic_file, iter_jsonl
from tokenmill.common.text_keys import dedup_key

FORGOTTEN_FILE = "_forgotten.jsonl"
FORGOTTEN_REASON = "forgotten"  # tokenized_bins' drop reason (dropped_forgotten)
REMOVALS_KEY = "removals"  # a version's manifest: every takedown so far (docs/format.md, "Takedowns")
# the fields a chat, preference or RL record is rendered from, when it has no text: its key is over them
RENDERED_FIELDS = ("messages", "prompt", "chosen", "rejected", "responses", "rewards")


def record_text(rec: dict) -> str:
    """What a takedown matches and keys a record by: its `text` (a record without one: its rendered fields, as
    JSON)."""
    text = rec.get("text")
    if isinstance(text, str) and text:
        return text
    return json.dumps({k: rec[k] for k in RENDERED_FIELDS if k in rec}, ensure_ascii=False, sort_keys=True)


def text_key(rec: dict) -> str:
    """The record's exact-text key: dedup's exact key of its text."""
    return hashlib.sha256(dedup_key(record_text(rec)).encode("utf-8")).hexdigest()  # dedup's keys.key_digest


@dataclass(frozen=True, kw_only=True)
class Forgotten:
    """The ids and text keys of the forgotten records (empty: no takedown, and nothing is keyed)."""

    ids: frozenset[str] = field(default_factory=frozenset)
    keys: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def holds(self, rid: str, rec: dict) -> bool:
        return rid in self.ids or (bool(self) and text_key(rec) in self.keys)


def read_forgotten(bins_dir: Path) -> Forgotten:
    path = Path(bins_dir) / FORGOTTEN_FILE
    if not path.is_file():
        return Forgotten()
    entries = list(iter_jsonl(path))
    return Forgotten(ids=frozenset(e["id"] for e in entries), keys=frozenset(e["key"] for e in entries))


def add_forgotten(bins_dir: Path, entries: Iterable[dict]) -> None:
    """Appends the entries whose id the list lacks (a takedown run again adds nothing), rewriting the file
    atomically: a reader sees the old list or the new one."""
    path = Path(bins_dir) / FORGOTTEN_FILE
    old = list(iter_jsonl(path)) if path.is_file() else []
    known = {e["id"] for e in old}
    new = {e["id"]: e for e in entries if e["id"] not in known}
    with atomic_file(path) as f:
        for entry in [*old, *new.values()]:
            f.write(json.dumps(entry, ensure_ascii=False, sort_keys=True) + "\n")
