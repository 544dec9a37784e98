"""The dedup index: one segment per batch, holding what later batches need to deduplicate against its records.

A segment is a folder laid out like the stage folder's step files, so the steps read an indexed chunk as they read
one of the batch (`Chunk.root` names the segment), one chunk per chunk of the batch:

  segment.json                    format_version, the settings the signatures depend on, per chunk: name, chunk,
                                  records (indexed), kept, items; written last
  docs/<stem>.npy, .paths.json    document table of the indexed records (id, meta count, lengths, source)
  keys/<stem>.digest*.npy         SHA-256 digests of the indexed records' keys, sorted, with prefix and ordinal
  keys/<stem>.key.zst, .key_offsets.npy   the keys of the kept records, compressed in frames (io.write_zstd_blocks;
                                  verification re-reads them; a near duplicate's key is empty: only its digest is
                                  looked up); format 2-3: .key.bin uncompressed
  signatures/<stem>.npy, .items.npz   MinHash signatures of the kept records folded to 16 bits (uint16,
                                  minhash.fold16: the verification pre-filter folds them on to a byte, and a bucket task
                                  takes an oversized bucket's order words from them); format 3: uint8, format 2: uint32
  lsh/<stem>.hash.npy, .item.npy, .fence.npy   band hashes of the kept records' items, each band sorted by hash,
                                  their item numbers in the chunk, and every 64th hash; formats 2-3: .doc.npy
                                  (ordinals) and .order.npy (the order words) instead of .item.npy

The indexed records of a batch are those that are not exact duplicates: every record whose key no earlier record
(indexed or of the batch) has, kept or removed as a near duplicate. Each key digest is in one segment at most.
A segment is written to a temporary folder renamed into place: it is complete or absent.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_write_json, read_json, write_zstd_blocks
from tokenmill.errors import ConfigError, StaleUpstreamError
from tokenmill.stages.dedup.buckets import write_index_lsh
from tokenmill.stages.dedup.layout import (
    DOCS_DIR,
    KEY_ZST,
    KEYS_DIR,
    LSH_DIR,
    SIGNATURE_DIR,
    Chunk,
    folder,
    releases_memory,
)
from tokenmill.stages.dedup.minhash import fold16
from tokenmill.stages.dedup.settings import DedupSettings

SEGMENT_FILE = "segment.json"
INDEX_FORMAT = 4  # 2: document tables hold by_word and the quality fields, keys of word-shingled records are spaced;
# 3: signatures as bytes, LSH ordinals int32 (0.4 KB less per record); 4: signatures as fold16 and no LSH order
# words, LSH item numbers, keys compressed (a quarter less); segments of formats 2 and 3 are read as they are
READABLE_FORMATS = (2, 3, INDEX_FORMAT)
# the settings an indexed record's key, signatures and band hashes depend on: every segment must share them
SKETCH_SETTINGS = (
    "threshold",
    "num_perm",
    "seed",
    "shingles",
    "ngram",
    "ngram_bounds",
    "word_ngram_bounds",
    "shingle_hash",
    "strip_symbols",
    "fold_chinese",
)


def sketch_settings(settings: DedupSettings, bands: int, rows: int) -> dict:
    return {**{k: getattr(settings, k) for k in SKETCH_SETTINGS}, "bands": bands, "rows": rows}


def indexed_band_shape(index_dirs: list[Path]) -> tuple[int, int] | None:
    """(bands, rows) the first index segment was built with, None without one: an automatic shape
    (DedupSettings.bands 0) follows it, so a data root indexed under an earlier default keeps working."""
    first = next((Path(seg) / SEGMENT_FILE for seg in index_dirs if (Path(seg) / SEGMENT_FILE).exists()), None)
    if first is None:
        return None
    built = read_json(first)["settings"]
    return int(built["bands"]), int(built["rows"])


def read_index(index_dirs: list[Path], sketch: dict) -> tuple[list[Chunk], list[dict]]:
    """The chunks of the index segments in order (global numbering from 0) and their manifests; a missing segment
    or one sketched with other settings is refused naming it."""
    chunks, manifests, first = [], [], 0
    for seg in map(Path, index_dirs):
        if not (seg / SEGMENT_FILE).exists():
            raise StaleUpstreamError(f"{seg}: not a dedup index segment (no {SEGMENT_FILE}); materialize that batch")
        manifest = read_json(seg / SEGMENT_FILE)
        if manifest.get("format_version") not in READABLE_FORMATS:
            raise StaleUpstreamError(
                f"{seg / SEGMENT_FILE}: format_version {manifest.get('format_version')!r}, this code reads "
                f"{' and '.join(map(str, READABLE_FORMATS))}; rebuild the index"
            )
        differ = sorted(k for k in sketch if manifest["settings"].get(k) != sketch[k])
        if differ:
            raise ConfigError(
                f"{seg / SEGMENT_FILE}: built with other dedup settings ({', '.join(differ)}: "
                f"{[manifest['settings'].get(k) for k in differ]}, now {[sketch[k] for k in differ]}); keep the "
                "settings of the index or rebuild it from the first batch"
            )
        for c in manifest["chunks"]:
            chunks.append(Chunk.of_segment(c, root=str(seg), first=first))
            first += c["records"]
        manifests.append(manifest)
    return chunks, manifests


@dataclass(frozen=True, kw_only=True)
class SegmentTask:
    chunk: Chunk  # a chunk of the batch
    out_dir: Path  # the stage folder holding its step files
    segment: Path  # the segment folder being written
    dropped: np.ndarray  # ordinals of the chunk's records not indexed (exact duplicates)
    near: np.ndarray  # ordinals of indexed records removed as near duplicates (no key, signature or band)
    rows: int


@dataclass(frozen=True, kw_only=True)
class SegmentChunk:
    name: str
    chunk: int
    records: int
    kept: int
    items: int


@releases_memory
def write_segment_chunk(task: SegmentTask) -> SegmentChunk:
    """Copies the indexed records' rows of the chunk's step files into the segment (renumbered 0..n-1)."""
    c, seg = task.chunk, task.segment

    def src(step: str, suffix: str) -> Path:
        return c.step_file(task.out_dir, step, suffix)

    def dst(step: str, suffix: str) -> Path:
        return folder(seg, step) / f"{c.stem}{suffix}"

    table = np.load(src(DOCS_DIR, ".npy"))
    indexed = np.ones(len(table), dtype=bool)
    indexed[task.dropped] = False
    kept = indexed.copy()
    kept[task.near] = False
    renumber = np.cumsum(indexed) - 1
    np.save(dst(DOCS_DIR, ".npy"), table[indexed])
    shutil.copyfile(src(DOCS_DIR, ".paths.json"), dst(DOCS_DIR, ".paths.json"))

    ordinal = np.load(src(KEYS_DIR, ".digest_ordinal.npy"))
    by_digest = indexed[ordinal]  # digest order kept: renumbering preserves the (digest, ordinal) order
    for suffix in (".digest.npy", ".digest_prefix.npy"):
        np.save(dst(KEYS_DIR, suffix), np.load(src(KEYS_DIR, suffix))[by_digest])
    np.save(dst(KEYS_DIR, ".digest_ordinal.npy"), renumber[ordinal[by_digest]])
    offsets = np.load(src(KEYS_DIR, ".key_offsets.npy"))
    lengths = np.diff(offsets)
    key_bytes = np.fromfile(src(KEYS_DIR, ".key.bin"), dtype=np.uint8)
    write_zstd_blocks(dst(KEYS_DIR, KEY_ZST), key_bytes[np.repeat(kept, lengths)].tobytes())
    new_offsets = np.zeros(int(indexed.sum()) + 1, dtype=np.int64)
    np.cumsum((lengths * kept)[indexed], out=new_offsets[1:])
    np.save(dst(KEYS_DIR, ".key_offsets.npy"), new_offsets)

    items = np.load(src(SIGNATURE_DIR, ".items.npz"))
    item_doc, item_n = items["item_doc"], items["item_n"]
    sketched = kept[item_doc]  # a kept record's items: its key is not empty (an empty one has none)
    sig = np.load(src(SIGNATURE_DIR, ".npy"))[sketched]
    np.save(dst(SIGNATURE_DIR, ".npy"), fold16(sig))
    item_doc = renumber[item_doc[sketched]]
    np.savez(dst(SIGNATURE_DIR, ".items.npz"), item_doc=item_doc, item_n=item_n[sketched])
    bands = np.load(src(SIGNATURE_DIR, ".bands.npy"))[:, sketched]
    n_items = write_index_lsh(folder(seg, LSH_DIR), c.stem, bands)
    return SegmentChunk(name=c.name, chunk=c.chunk, records=int(indexed.sum()), kept=int(kept.sum()), items=n_items)


def staging_folder(index_out: Path) -> Path:
    path = index_out.parent / f".{index_out.name}.tmp-{uuid.uuid4().hex[:8]}"
    path.mkdir(parents=True)
    return path


def publish_segment(staged: Path, index_out: Path, sketch: dict, parts: list[SegmentChunk]) -> dict:
    """Writes segment.json into the staged folder and renames it to `index_out` (replacing an older one); returns
    the segment's counts."""
    manifest = {
        "format_version": INDEX_FORMAT,
        "settings": sketch,
        "records": sum(p.records for p in parts),
        "kept": sum(p.kept for p in parts),
        "chunks": [
            {"name": p.name, "chunk": p.chunk, "records": p.records, "kept": p.kept, "items": p.items} for p in parts
        ],
    }
    atomic_write_json(staged / SEGMENT_FILE, manifest)
    size = sum(f.stat().st_size for f in staged.rglob("*") if f.is_file())
    if index_out.exists():
        old = index_out.parent / f".{index_out.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(index_out, old)
        shutil.rmtree(old)
    os.replace(staged, index_out)
    return {"records_added": manifest["records"], "kept_added": manifest["kept"], "bytes_added": size}


def segment_items(manifests: list[dict]) -> int:
    """LSH items of the indexed kept records (what the bucket step reads of the index)."""
    return sum(c["items"] for m in manifests for c in m["chunks"])
