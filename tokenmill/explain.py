"""`tokenmill explain ID`: one record's fate through the graph, read from the stage folders of a data root.

A record is found by its id (docs/format.md: a stable hash of its source path and line or index), or by `PATH:N`
(its source file and line or index, how a raw_records drop is listed). The stages are asked in graph order:

  raw_records     <batch>/_rejected.jsonl: entries name path and line, their id is computed
  cleaned_jsonl   <batch>/_rejected.jsonl: reason, the rule's detail and evidence fields, the text
  deduped_jsonl   <batch>/removed.jsonl, then dedup_report/<batch>/clusters.jsonl for the cluster (level,
                  similarity, keep reason, the kept record and its source), both texts from cleaned_jsonl
  tokenized_bins  _rejected.json (the training type cannot render it), else the split, version and shard whose
                  record_ids.json lists it

Memory stays flat as the corpus grows: files are searched with `find_line` (a memory map and a byte search for the
line that starts with the id, as tokenmill writes every record, rejected and removed entry), never loaded whole.
"""

from __future__ import annotations

import difflib
import json
import mmap
import re
from collections.abc import Iterator
from pathlib import Path

from tokenmill.common.io import REJECTED_FILE, REMOVED_FILE, batch_folders, read_json, record_id, record_shards
from tokenmill.common.quarantine import covers
from tokenmill.stages.registry import kept_search_order
from tokenmill_loader.format import SPLITS, manifest_path

DEDUP_REPORT_FILE = "report.json"  # dedup_report's layout names (tokenmill.stages.dedup.layout), without its imports
REMOVALS_KEY = "removals"  # tokenized_bins' takedowns (tokenmill.stages.tokenize.forgotten), without its imports
FORGOTTEN_REASON = "forgotten"
WITHHELD = "(withheld: taken down)"  # what explain shows of a forgotten record's text, and of a later copy's
DEDUP_CLUSTERS_FILE = "clusters.jsonl"
ID_RE = re.compile(r"[0-9a-f]{16}")
DIFF_CONTEXT = 4  # unchanged words shown around each change in a word diff
CHARS_PER_WORD = 20  # fewer spaces than one per this many characters: a text without word spaces (diffed by character)
_ENTRY_FIELDS = {"id", "source", "reason", "detail", "text", "text_chars"}  # the rest of a rejected entry: evidence


def find_line(path: Path, rid: str) -> dict | None:
    """The JSON line of `path` that starts with `{"id": "<rid>"`, parsed; None when there is none."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    needle = b'{"id": "' + rid.encode("ascii") + b'"'
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        at = data.find(needle)
        while at > 0 and data[at - 1] != ord("\n"):  # inside a text, not the start of a line
            at = data.find(needle, at + 1)
        if at < 0:
            return None
        end = data.find(b"\n", at)
        return json.loads(data[at : end if end >= 0 else len(data)])


def find_in_shards(shards: list[Path], rid: str) -> tuple[Path, dict] | tuple[None, None]:
    """(shard, record) of the first shard holding record `rid`."""
    for shard in shards:
        if (record := find_line(shard, rid)) is not None:
            return shard, record
    return None, None


def resolve_ids(key: str) -> list[str]:
    """The ids `key` may mean: itself, or for `PATH:N` the record at line N, then at index N, of PATH."""
    if ID_RE.fullmatch(key):
        return [key]
    path, _, n = key.rpartition(":")
    if path and n.isdigit():
        return [record_id(path, line=int(n)), record_id(path, index=int(n))]
    return [key]


def where(source: dict | None) -> str:
    """`path:line` (or `path:index`), with a WARC record's byte offset."""
    if not source:
        return "?"
    at = source.get("line", source.get("index"))
    text = f"{source.get('path')}:{'' if at is None else at}"
    return text + (f" (byte offset {source['offset']})" if "offset" in source else "")


def word_diff(before: str, after: str, context: int = DIFF_CONTEXT) -> str:
    """`after` against `before`, word by word: `[-removed-]` `{+added+}`, each change with `context` words around
    it and `…` for the words left out. Empty when the words are the same. A text written without spaces (Chinese,
    Japanese, Thai) is compared character by character."""
    by_char = before.count(" ") * CHARS_PER_WORD < len(before)
    a, b = (list(before), list(after)) if by_char else (before.split(), after.split())
    sep = "" if by_char else " "
    groups = list(difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context))
    if not groups or all(op == "equal" for g in groups for op, *_ in g):
        return ""
    parts: list[str] = []
    for group in groups:
        if group[0][1] > 0:
            parts.append("…")
        for op, i1, i2, j1, j2 in group:
            if op == "equal":
                parts.extend(a[i1:i2])
                continue
            if i2 > i1:
                parts.append("[-" + sep.join(a[i1:i2]) + "-]")
            if j2 > j1:
                parts.append("{+" + sep.join(b[j1:j2]) + "+}")
    if groups[-1][-1][2] < len(a):
        parts.append("…")
    return sep.join(parts)


def _batches(data_root: Path, stage: str) -> list[Path]:
    return batch_folders(data_root / stage)


def _raw_drop(data_root: Path, ids: list[str]) -> dict | None:
    for folder in _raw_folders(data_root):
        for entry in _entries(folder / REJECTED_FILE):
            loc = {"line": entry["line"]} if "line" in entry else {"index": entry.get("index")}
            if "count" not in entry and record_id(entry.get("path", ""), **loc) in ids:
                return _raw_fate(folder, entry, record_id(entry.get("path", ""), **loc))
    return None


def _raw_run_drop(data_root: Path, key: str) -> dict | None:
    """For `PATH:N` past its file's quarantine budget: the raw_records run entry covering line (or index) N."""
    path, _, n = key.rpartition(":")
    if not (path and n.isdigit()):
        return None
    for folder in _raw_folders(data_root):
        for entry in _entries(folder / REJECTED_FILE):
            for loc in ("line", "index"):
                if "count" in entry and entry.get("path") == path and covers(entry, loc, int(n)):
                    fate = _raw_fate(folder, entry, record_id(path, **{loc: int(n)}))
                    fate["source"][loc] = int(n)
                    fate["run"] = {k: entry.get(k) for k in (loc, f"last_{loc}", "count", "scattered") if k in entry}
                    return fate
    return None


def _raw_folders(data_root: Path) -> list[Path]:
    quarantine = data_root / "raw_records" / "_quarantine"
    held = sorted(p for p in quarantine.iterdir() if p.is_dir()) if quarantine.is_dir() else []
    return _batches(data_root, "raw_records") + held


def _raw_fate(folder: Path, entry: dict, rid: str) -> dict:
    return {
        "id": rid,
        "fate": "dropped",
        "stage": "raw_records",
        "batch": folder.name,
        "quarantined": folder.parent.name == "_quarantine",
        "reason": entry.get("reason"),
        "detail": entry.get("detail"),
        "source": {k: entry[k] for k in ("path", "line", "index", "offset") if k in entry},
        "text": entry.get("snippet"),
    }


def _entries(path: Path) -> Iterator[dict]:
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _clean_drop(data_root: Path, rid: str) -> dict | None:
    for folder in _batches(data_root, "cleaned_jsonl"):
        entry = find_line(folder / REJECTED_FILE, rid)
        if entry is None:
            continue
        _, raw = find_in_shards(record_shards(data_root / "raw_records" / folder.name), rid)
        return {
            "id": rid,
            "fate": "dropped",
            "stage": "cleaned_jsonl",
            "batch": folder.name,
            "reason": entry.get("reason"),
            "detail": entry.get("detail"),
            "evidence": {k: v for k, v in entry.items() if k not in _ENTRY_FIELDS},
            "source": entry.get("source"),
            # the whole text as raw_records holds it; the entry's (cut) text is how the rule saw it
            "text": raw["text"] if raw else entry.get("text"),
            "text_when_rejected": entry.get("text"),
        }
    return None


def _cluster_of(report_dir: Path, rid: str) -> dict | None:
    """The clusters.jsonl line listing `rid` (the kept id and every member are written as `"id": "..."`)."""
    path = report_dir / DEDUP_CLUSTERS_FILE
    if not path.is_file():
        return None
    needle = f'"id": "{rid}"'
    with open(path, encoding="utf-8") as f:
        for line in f:
            if needle in line:
                return json.loads(line)
    return None


def _text_of(data_root: Path, rid: str, batches: list[str]) -> tuple[str | None, dict | None]:
    """(batch, record) of `rid` in cleaned_jsonl, trying `batches` in order."""
    for batch in batches:
        _, record = find_in_shards(record_shards(data_root / "cleaned_jsonl" / batch), rid)
        if record is not None:
            return batch, record
    return None, None


def _dedup_drop(data_root: Path, rid: str) -> dict | None:
    for folder in _batches(data_root, "deduped_jsonl"):
        entry = find_line(folder / REMOVED_FILE, rid)
        if entry is None:
            continue
        batch = folder.name
        report_dir = data_root / "dedup_report" / batch
        cluster = _cluster_of(report_dir, rid) or {}
        members = {m["id"]: m for m in cluster.get("members", [])}
        kept_id: str = entry["duplicate_of"]  # every removed.jsonl entry names it
        kept_member = members.get(kept_id, {})
        earlier = [p.name for p in _batches(data_root, "cleaned_jsonl") if p.name < batch][::-1]
        _, record = _text_of(data_root, rid, [batch])
        kept_batch, kept = _text_of(data_root, kept_id, earlier if kept_member.get("role") == "indexed" else [batch])
        if kept is None:  # an exact copy of a record of its own batch that was itself removed (first_seen)
            kept_batch, kept = _text_of(data_root, kept_id, [batch, *earlier])
        report = read_json(report_dir / DEDUP_REPORT_FILE) if (report_dir / DEDUP_REPORT_FILE).is_file() else {}
        text, kept_text = (record or {}).get("text"), (kept or {}).get("text")
        bins = data_root / "tokenized_bins"
        if taken_down := _forgotten(bins, rid) or _forgotten(bins, kept_id):  # neither text is shown
            text = kept_text = None
        return {
            "id": rid,
            "fate": "dropped",
            "stage": "deduped_jsonl",
            "batch": batch,
            "reason": entry.get("reason"),
            "level": entry.get("level"),
            "similarity": entry.get("similarity"),
            "threshold": report.get("parameters", {}).get("threshold"),
            "source": entry.get("source"),
            "text": text,
            "duplicate_of": {
                "id": kept_id,
                "batch": kept_batch,
                "role": kept_member.get("role", "kept"),
                "source": kept_member.get("source") or (kept or {}).get("source"),
                "text": kept_text,
            },
            "cluster": {
                "file": str(Path("dedup_report") / batch / DEDUP_CLUSTERS_FILE),
                "number": cluster.get("cluster"),
                "size": cluster.get("size"),
                "keep_reason": cluster.get("reason"),
            },
            "diff": word_diff(kept_text, text) if text is not None and kept_text is not None else None,
            "taken_down": taken_down,
        }
    return None


def _forgotten(bins: Path, rid: str) -> dict | None:
    """The takedown that removed `rid` (`tokenmill forget`), from the latest version's removals; None: none did."""
    latest = manifest_path(bins / SPLITS[0])
    removals = read_json(latest).get(REMOVALS_KEY, []) if latest.is_file() else []
    for removal in removals:
        if rid in removal["records"] or rid in removal["duplicates"]:
            said = {k: removal.get(k) for k in ("version", "selector", "by", "at")}
            why = removal.get("reason")
            return {"fate": "forgotten", "stage": "tokenized_bins", "reason": FORGOTTEN_REASON, "why": why, **said}
    return None


def _tokenized(data_root: Path, rid: str) -> dict | None:
    """Where tokenized_bins put `rid` (split, version, shard, record of the shard), why it dropped it, or the
    takedown that removed it."""
    bins = data_root / "tokenized_bins"
    if forgotten := _forgotten(bins, rid):
        return forgotten
    rejected = bins / "_rejected.json"
    if rejected.is_file() and f'"{rid}"' in rejected.read_text(encoding="utf-8"):
        entry = next((e for e in read_json(rejected) if e.get("id") == rid), None)
        if entry is not None:
            return {"fate": "dropped", "stage": "tokenized_bins", **entry}
    needle = f'"{rid}"'.encode("ascii")
    for split in SPLITS:
        latest = manifest_path(bins / split)  # the version current.json names for both splits
        if not latest.is_file():
            continue
        manifest = read_json(latest)
        for shard in manifest["shards"]:
            ids_path = bins / split / shard["name"] / "record_ids.json"
            if ids_path.is_file() and needle in ids_path.read_bytes():
                return {
                    "fate": "kept",
                    "stage": "tokenized_bins",
                    "split": split,
                    "version": manifest.get("version"),
                    "shard": shard["name"],
                    "record_in_shard": read_json(ids_path).index(rid),
                }
    return None


def _kept(data_root: Path, rid: str) -> dict | None:
    """A record no stage dropped: the last stage holding it (tokenized_bins when it is in the latest version)."""
    for stage in kept_search_order():
        for folder in _batches(data_root, stage):
            shard, record = find_in_shards(record_shards(folder), rid)
            if shard is None or record is None:  # both or neither
                continue
            fate = {
                "id": rid,
                "fate": "kept",
                "stage": stage,
                "batch": folder.name,
                "shard": shard.name,
                "source": record.get("source"),
                "text": record.get("text"),
            }
            if stage == "deduped_jsonl" and (tokenized := _tokenized(data_root, rid)):
                withheld = tokenized.get("reason") == FORGOTTEN_REASON  # a taken-down text is not shown either
                fate.update({k: v for k, v in tokenized.items() if k not in ("id", "source", "text")})
                if withheld:
                    fate["text"] = None
                fate["batch_shard"] = shard.name
            return fate
    return None


def explain(data_root: Path, key: str) -> dict | None:
    """The fate of record `key` (an id, or `PATH:N`) in the data root; None when no stage knows it."""
    data_root = Path(data_root)
    ids = resolve_ids(key)
    if fate := _raw_drop(data_root, ids):
        return fate
    for rid in ids:
        for find in (_clean_drop, _dedup_drop, _kept):
            if fate := find(data_root, rid):
                return fate
    return _raw_run_drop(data_root, key)  # last: a scattered run's span also holds records kept or dropped otherwise


def _indent(text: str | None) -> str:
    return "\n".join("    " + line for line in (text if text is not None else "(not found)").splitlines() or [""])


def _takedown(removal: dict) -> str:
    said = "".join(f", {k} {removal[k]}" for k in ("by", "at") if removal.get(k))
    return f"in tokenized_bins version {removal['version']} ({removal['why'] or 'no reason given'}{said})"


def render(fate: dict) -> str:
    """The fate as the command prints it: a few labelled lines, then the texts in full."""
    lines = [f"record {fate['id']}", f"  source      {where(fate.get('source'))}"]
    if fate["fate"] == "forgotten":
        lines.append(f"  forgotten   {_takedown(fate)}")
        lines.append(f"  selector    {json.dumps(fate['selector'], ensure_ascii=False)}")
        return "\n".join([*lines, "  text", _indent(WITHHELD)])
    if fate["fate"] == "kept":
        if fate["stage"] == "tokenized_bins":
            lines.append(
                f"  kept        tokenized_bins {fate['split']} version {fate['version']}, {fate['shard']} (record "
                f"{fate['record_in_shard']} of the shard); deduped_jsonl batch {fate['batch']}, {fate['batch_shard']}"
            )
        else:
            lines.append(f"  kept        in {fate['stage']} batch {fate['batch']}, {fate['shard']}")
        return "\n".join([*lines, "  text", _indent(fate.get("text"))])
    batch = f" batch {fate['batch']}" if fate.get("batch") else ""
    lines.append(f"  dropped by  {fate['stage']}{batch}" + (" (quarantined)" if fate.get("quarantined") else ""))
    lines.append(f"  reason      {fate.get('reason')}")
    if run := fate.get("run"):
        key = "line" if "line" in run else "index"
        mixed = ", mixed with other records" if run.get("scattered") else ""
        lines.append(
            f"  run         one of {run['count']:,} rejected for it in {key}s {run[key]}-{run[f'last_{key}']}{mixed} "
            "(past the file's quarantine budget: each counted, the run's first detail and snippet kept)"
        )
    if fate.get("detail"):
        lines.append(f"  detail      {fate['detail']}")
    for name, value in (fate.get("evidence") or {}).items():
        lines.append(f"  {name:<11} {json.dumps(value, ensure_ascii=False)}")
    if fate["stage"] != "deduped_jsonl":
        label = "snippet" if fate["stage"] == "raw_records" else "text"
        text = WITHHELD if fate.get("reason") == FORGOTTEN_REASON else fate.get("text")
        return "\n".join([*lines, f"  {label}", _indent(text)])
    kept, cluster = fate["duplicate_of"], fate["cluster"]
    threshold = f" (threshold {fate['threshold']})" if fate.get("threshold") is not None else ""
    if fate.get("threshold") is not None and fate["level"] == "near" and fate["similarity"] < fate["threshold"]:
        threshold = f" (threshold {fate['threshold']}: joined to the kept record through others of its cluster)"
    lines += [
        f"  level       {fate['level']}, similarity {fate['similarity']}{threshold}",
        f"  kept record {kept['id']} ({kept['role']}, batch {kept['batch']}), source {where(kept['source'])}",
        f"  cluster     {cluster['number']} of {cluster['file']}: {cluster['size']} records, kept because: "
        f"{cluster['keep_reason']}",
    ]
    if fate.get("diff"):
        lines += ["  diff        kept -> this record ([-kept only-] {+this only+})", _indent(fate["diff"])]
    elif fate.get("diff") == "":
        lines.append("  diff        the same words as the kept record")
    if down := fate.get("taken_down"):
        lines.append(f"  forgotten   {_takedown(down)}")
        return "\n".join([*lines, "  text", _indent(WITHHELD), "  kept text", _indent(WITHHELD)])
    return "\n".join([*lines, "  text", _indent(fate.get("text")), "  kept text", _indent(kept.get("text"))])
