"""Versions of tokenized_bins: what is published, publishing a new version, recovery and retention.

Each split folder (`<bins>/<split>/`) is a stable directory. Shard folders and version manifests
(`dataset.v<K>.json`) are immutable once written. `<bins>/current.json` names the published version of both splits
and is the commit point: replaced atomically, it switches train and val together. Each split's `dataset.json`, a
copy of that version's manifest for readers that do not know the pointer, is refreshed after it. A kill at any
point leaves both splits readable at one version (the previous one before the switch, the new one after); `recover`
then removes what no published version names (unpublished manifests, shards, tokenizer copies, temporary files),
brings each dataset.json to the pointer's version, and writes the pointer of a data root written before it.
A superseded version is removed by `apply_retention` only after it has been superseded for `retention_hours`
(its successor's manifest mtime, set when that successor was published) and when it is not one of the newest
`keep_versions`; the latest version is never removed. Only one run writes a data root at a time (its lock).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenmill.common.failpoints import failpoint
from tokenmill.common.io import TEMPORARY_GLOB, atomic_file, atomic_write_json, link_atomic, read_json
from tokenmill.errors import CorruptOutputError
from tokenmill_loader.format import (
    CURRENT_FILE,
    DATASET_FILE,
    SHARD_DIR,
    SPLITS,
    TOKENIZER_EXTRA_FILES,
    TOKENIZER_FILE,
    list_versions,
    manifest_path,
    version_file,
)

BATCHES_DIR = "_batches"  # per-batch counts of the latest generation, so a later run reports the whole dataset
PENDING_SUFFIX = ".pending"  # a takedown's batch counts of a version not published yet (pending_file)
TMP_PREFIX = ".tmp-"  # what a run writes before renaming it into place (shards, files)
STAGE = "tokenized_bins"


@dataclass(frozen=True, kw_only=True)
class Published:
    """The latest published version: its number, generation, batches, tokenizer and encoding settings."""

    version: int
    generation: int
    batches: tuple[str, ...]
    tokenizer_sha256: str
    encoding: dict
    manifests: dict[str, dict]  # split -> its manifest

    @classmethod
    def of(cls, manifests: dict[str, dict]) -> Published:
        m = manifests[SPLITS[0]]
        return cls(
            version=m["version"],
            generation=m["generation"],
            batches=tuple(m["batches"]),
            tokenizer_sha256=(m.get("tokenizer") or {}).get("sha256", ""),
            encoding=m.get("encoding") or {},
            manifests=manifests,
        )


def batch_summary_file(bins_dir: Path, generation: int, batch: str) -> Path:
    return Path(bins_dir) / BATCHES_DIR / f"g{generation:06d}.{batch}.json"


def batch_token_counts_file(bins_dir: Path, generation: int, batch: str) -> Path:
    """The tokens of each record of a batch, per split (.npz), beside its summary (written first: the summary,
    written last, says both are complete)."""
    return Path(bins_dir) / BATCHES_DIR / f"g{generation:06d}.{batch}.tokens.npz"


def pending_file(path: Path, version: int) -> Path:
    """Where a takedown writes a batch file of `version` before it publishes it (settle_pending renames it onto
    `path` once the version is published; recover removes it if it never is)."""
    return path.with_name(f"{path.name}.v{version:06d}{PENDING_SUFFIX}")


def settle_pending(bins_dir: Path, version: int, actions: list[str]) -> None:
    """The batch files a takedown wrote for `version`, now published, renamed into place."""
    tail = f".v{version:06d}{PENDING_SUFFIX}"
    for p in sorted((Path(bins_dir) / BATCHES_DIR).glob(f"g*{tail}")):
        os.replace(p, p.with_name(p.name.removesuffix(tail)))
        actions.append(f"settled {BATCHES_DIR}/{p.name.removesuffix(tail)} of version {version}")


def _copy_atomic(src: Path, dst: Path) -> None:
    with open(src, "rb") as given, atomic_file(dst, "wb") as f:
        shutil.copyfileobj(given, f)


def _remove(path: Path, actions: list[str], why: str) -> None:
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink(missing_ok=True)
    actions.append(f"removed {why} {path.parent.name}/{path.name}")


def _manifest_version(path: Path) -> int | None:
    return read_json(path).get("version") if path.exists() else None


def _current(bins_dir: Path) -> int | None:
    """The version current.json publishes (None: no pointer yet)."""
    return _manifest_version(bins_dir / CURRENT_FILE)


def _link_tokenizer(split_dir: Path, version: int, extras_from: Path | None) -> None:
    """The split's tokenizer.json (a hard link to the version's tokenizer-<sha>.json) and the tokenizer's extra
    files (from `extras_from`; None: already in place)."""
    for name in TOKENIZER_EXTRA_FILES:
        if extras_from is not None and (Path(extras_from) / name).is_file():
            _copy_atomic(Path(extras_from) / name, split_dir / name)
    tokenizer = read_json(split_dir / version_file(version))["tokenizer"]["file"]
    link_atomic(split_dir / tokenizer, split_dir / TOKENIZER_FILE)  # the version's copy, not a second one


def _has_tokenizer_of(split_dir: Path, version: int) -> bool:
    """Whether the split's tokenizer.json is the version's copy (a run killed before the switch may have linked the
    next version's)."""
    latest = split_dir / TOKENIZER_FILE
    copy = split_dir / read_json(split_dir / version_file(version))["tokenizer"]["file"]
    return latest.is_file() and (os.path.samefile(latest, copy) or filecmp.cmp(latest, copy, shallow=False))


def _copy_manifest(split_dir: Path, version: int) -> None:
    _copy_atomic(split_dir / version_file(version), split_dir / DATASET_FILE)


def recover(bins_dir: Path, log=None) -> Published | None:
    """Brings bins_dir back to its latest published version (None: nothing published yet); logs each action."""
    bins_dir = Path(bins_dir)
    actions: list[str] = []
    split_dirs = {s: bins_dir / s for s in SPLITS}
    for d in (bins_dir, bins_dir / BATCHES_DIR, *split_dirs.values()):
        for p in sorted(d.glob(f"{TMP_PREFIX}*")) + sorted(d.glob(TEMPORARY_GLOB)) if d.is_dir() else []:
            _remove(p, actions, "unfinished")
    pointer = _current(bins_dir)
    copied = {s: _manifest_version(d / DATASET_FILE) for s, d in split_dirs.items()}
    # without a pointer (a data root written before it), the splits' dataset.json: the newest one is published
    latest = pointer or max((v for v in copied.values() if v is not None), default=None)
    if latest is not None:
        for s, d in split_dirs.items():
            if not (d / version_file(latest)).exists():
                raise CorruptOutputError(f"{d / version_file(latest)}: missing, while version {latest} is published")
            if copied[s] == latest and _has_tokenizer_of(d, latest):
                continue
            # the extras are written before the switch; a data root without a pointer has them in the split ahead
            ahead = next((split_dirs[o] for o in SPLITS if copied[o] == latest), None)
            _link_tokenizer(d, latest, extras_from=ahead if pointer is None else None)
            _copy_manifest(d, latest)
            actions.append(f"re-pointed {s}/{DATASET_FILE} and {TOKENIZER_FILE} to version {latest}")
        if pointer is None:
            _switch(bins_dir, latest)
            actions.append(f"wrote {CURRENT_FILE}: version {latest}, the version both splits are read at")
    for d in split_dirs.values():
        for v in list_versions(d):
            if latest is None or v > latest:
                _remove(d / version_file(v), actions, "unpublished")
    _remove_unreferenced(bins_dir, actions)
    published = Published.of({s: read_json(d / DATASET_FILE) for s, d in split_dirs.items()}) if latest else None
    if published is not None:  # a takedown killed after its switch: its batch counts are the published ones
        settle_pending(bins_dir, published.version, actions)
    keep = (
        {
            f(bins_dir, published.generation, b)
            for b in published.batches
            for f in (batch_summary_file, batch_token_counts_file)
        }
        if published
        else set()
    )
    for p in sorted((bins_dir / BATCHES_DIR).glob("g*")):
        if p not in keep:
            _remove(p, actions, "unpublished")
    if log:
        for a in actions:
            log.info(f"recovered {STAGE}: {a}")
    return published


def _remove_unreferenced(bins_dir: Path, actions: list[str]) -> None:
    """Shard folders and tokenizer copies that no version manifest of their split names."""
    for s in SPLITS:
        d = bins_dir / s
        if not d.is_dir():
            continue
        names = {TOKENIZER_FILE, *TOKENIZER_EXTRA_FILES}
        manifests = [d / version_file(v) for v in list_versions(d)] + [d / DATASET_FILE]
        for path in manifests:
            if path.exists():
                m = read_json(path)
                names.update(sh["name"] for sh in m["shards"])
                names.add((m.get("tokenizer") or {}).get("file", TOKENIZER_FILE))
        for p in sorted(d.iterdir()):
            is_copy = p.name.startswith("tokenizer-") and p.suffix == ".json"
            if (SHARD_DIR.fullmatch(p.name) or is_copy) and p.name not in names:
                _remove(p, actions, "unreferenced")


def added_batches(bins_dir: Path, version: int) -> list[str]:
    """The batches `version` adds to the published dataset (every batch of a new generation)."""
    train = Path(bins_dir) / SPLITS[0]
    new = read_json(train / version_file(version))
    latest_file = manifest_path(train)
    latest = read_json(latest_file) if latest_file.exists() else {}
    if latest.get("generation") != new.get("generation"):
        return list(new["batches"])
    published = set(latest.get("batches", []))
    return [b for b in new["batches"] if b not in published]


def next_shard_index(split_dir: Path) -> int:
    """Shard numbers continue across versions and generations (after `recover`, only named shards remain)."""
    names = os.listdir(split_dir) if split_dir.is_dir() else []
    return max((int(m.group(1)) for m in map(SHARD_DIR.fullmatch, names) if m), default=-1) + 1


def _switch(bins_dir: Path, version: int) -> None:
    atomic_write_json(bins_dir / CURRENT_FILE, {"version": version})


def publish(
    bins_dir: Path,
    manifests: dict[str, dict],
    tokenizer_dir: Path | None,
    check: Callable[[int], None] | None = None,
) -> None:
    """Writes each split's version manifest (its shards and tokenizer copy already in place), runs `check` on the
    complete version, then switches current.json to it (both splits at once) and refreshes each split's
    dataset.json. The tokenizer's extra files come from `tokenizer_dir` (None: the split's, as they are: a version
    with the previous one's tokenizer). A check that raises publishes nothing (`recover` then removes the version's
    files)."""
    bins_dir = Path(bins_dir)
    version = manifests[SPLITS[0]]["version"]
    for s, m in manifests.items():
        atomic_write_json(bins_dir / s / version_file(version), m)
    failpoint(f"{STAGE}:version_written")
    if check is not None:
        check(version)
    now = time.time()
    for s in SPLITS:
        _link_tokenizer(bins_dir / s, version, extras_from=tokenizer_dir)
        # retention counts from here: when the previous version stops being the latest
        os.utime(bins_dir / s / version_file(version), (now, now))
    _switch(bins_dir, version)
    for s in SPLITS:
        _copy_manifest(bins_dir / s, version)
        failpoint(f"{STAGE}:split_published")


def apply_retention(bins_dir: Path, hours: float, keep_versions: int, now: float | None = None, log=None) -> list[int]:
    """Removes the superseded versions past retention (and then whatever only they named); returns them."""
    bins_dir = Path(bins_dir)
    now = time.time() if now is None else now
    versions = sorted({v for s in SPLITS for v in list_versions(bins_dir / s)})
    newest = versions[-keep_versions:]
    removed = []
    for older, newer in zip(versions, versions[1:]):
        manifests = [bins_dir / s / version_file(newer) for s in SPLITS]
        superseded_at = min(os.stat(p).st_mtime for p in manifests if p.exists())
        if older not in newest and now - superseded_at > hours * 3600:
            removed.append(older)
    actions: list[str] = []
    for v in removed:
        for s in SPLITS:
            _remove(bins_dir / s / version_file(v), actions, "expired")
    _remove_unreferenced(bins_dir, actions)
    if log and removed:
        log.info(f"{STAGE}: retention ({hours} h, newest {keep_versions} kept) removed versions {removed}")
    return removed
