"""The dedup key (the level-1 identity): the text key (tokenmill.common.text_keys: NFKC, case-fold, punctuation,
space and control removal) and its SHA-256, the key files of a chunk, and the exact level's groups.

No dagster import here: these run in spawned worker processes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.stages.dedup.layout import NpyRows, releases_memory


def exact_key(key: str) -> str:
    """The key of a spaced key (dedup_key(spaced=True)): what exact dedup hashes, the same with or without spaces."""
    return key.replace(" ", "")


def key_digest(key: str) -> bytes:
    """SHA-256 of the key (32 bytes): the level-1 identity."""
    return hashlib.sha256(key.encode("utf-8")).digest()


# ------------------------------------------------------------------------------------------------
# Key files of a chunk and the exact level (step 2, one task per digest range)
# ------------------------------------------------------------------------------------------------

EXACT_DTYPE = np.dtype([("doc", "<i8"), ("rep", "<i8")])


def write_keys(keys_dir: Path, stem: str, keys: list[str]) -> None:
    """The chunk's keys (UTF-8, concatenated, with byte offsets: verification re-reads any key by index) and its
    digest index: SHA-256 digests sorted (then by ordinal), with their first 8 bytes as a big-endian uint64
    prefix, so a task for one digest range reads just its slice."""
    encoded = [k.encode("utf-8") for k in keys]
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    (keys_dir / f"{stem}.key.bin").write_bytes(b"".join(encoded))
    np.save(keys_dir / f"{stem}.key_offsets.npy", offsets)
    digest = np.frombuffer(b"".join(key_digest(exact_key(k)) for k in keys), dtype=np.uint8).reshape(len(keys), 32)
    order = np.argsort(np.ascontiguousarray(digest).view(np.dtype((np.void, 32))).ravel(), kind="stable")
    np.save(keys_dir / f"{stem}.digest.npy", digest[order])
    np.save(keys_dir / f"{stem}.digest_prefix.npy", digest[order, :8].copy().view(">u8").ravel().astype(np.uint64))
    np.save(keys_dir / f"{stem}.digest_ordinal.npy", order.astype(np.int64))


@dataclass(frozen=True, kw_only=True)
class ExactTask:
    key_files: tuple[Path, ...]  # per chunk: its key files without the suffix (Chunk.step_file(out_dir, KEYS_DIR, ""))
    firsts: tuple[int, ...]
    lo: int
    hi: int
    out: Path


@dataclass(frozen=True, kw_only=True)
class ExactResult:
    groups: int  # exact groups of two or more documents
    members: int  # documents in them


@releases_memory
def exact_groups(task: ExactTask) -> ExactResult:
    """Documents with equal digests in one digest range: every member of a group of two or more as (doc, rep),
    rep being the group's first document (its representative for LSH), sorted by doc."""
    digests, docs = [], []
    for base, first in zip(task.key_files, task.firsts):
        with NpyRows(f"{base}.digest_prefix.npy") as prefix:
            a, b = prefix.searchsorted((), task.lo), prefix.searchsorted((), task.hi)
        with NpyRows(f"{base}.digest.npy") as f:
            digests.append(f.read((), a, b))
        with NpyRows(f"{base}.digest_ordinal.npy") as f:
            docs.append(f.read((), a, b) + first)
    digest = np.concatenate(digests) if digests else np.empty((0, 32), dtype=np.uint8)
    doc = np.concatenate(docs) if docs else np.empty(0, dtype=np.int64)
    by_doc = np.argsort(doc, kind="stable")
    view = np.ascontiguousarray(digest[by_doc]).view(np.dtype((np.void, 32))).ravel()
    order = by_doc[np.argsort(view, kind="stable")]
    doc, view = doc[order], np.ascontiguousarray(digest[order]).view(np.dtype((np.void, 32))).ravel()
    starts = np.flatnonzero(np.concatenate(([True], view[1:] != view[:-1]))) if len(doc) else np.empty(0, np.int64)
    sizes = np.diff(np.append(starts, len(doc)))
    run = np.repeat(np.arange(len(starts)), sizes)
    member = sizes[run] >= 2
    rows = np.empty(int(member.sum()), dtype=EXACT_DTYPE)
    rows["doc"], rows["rep"] = doc[member], doc[starts][run[member]]
    np.save(task.out, np.sort(rows, order="doc"))
    return ExactResult(groups=int((sizes >= 2).sum()), members=len(rows))
