"""raw_records: read a file or folder of .jsonl/.json/.txt/.csv (and .gz of these) into record JSONL shards.

Every input record becomes `{"id", "text", "meta", "source": {"path", "line"|"index"}}` (docs/format.md).
Bad input never stops the run and is never dropped silently: each bad line, record or file goes to
`_rejected.jsonl` with a reason and is counted, so docs_in = docs_out + sum(rejected).

Work is split into tasks of whole files (bounded input bytes); each task writes its own shards into a
private folder, and the parent renames them into one global sequence in task order, so the output is
byte-identical for any worker count.
"""
from __future__ import annotations

import csv
import codecs
import gzip
import json
import os
import shutil
import sys
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenmill.common.io import JsonlWriter, REJECTED_FILE, STATS_FILE, atomic_write_json, concat_files, dumps, record_id, shard_name
from tokenmill.common.parallel import map_ordered
from tokenmill.common.progress import Progress

READERS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".txt": "txt", ".csv": "csv"}
REASONS = ("malformed_json", "no_text_field", "not_an_object", "undecodable_bytes", "unreadable_file",
           "malformed_csv_row", "bad_fields")
SNIPPET_CHARS = 200
# poetry layouts (chinese-poetry): the body is a list of lines under one of these keys
BODY_KEYS = ("paragraphs", "content", "para")
TITLE_KEYS = ("title", "rhythmic")
# top-level fields that training types after tokenization need; kept as they are
CHAT_KEYS = ("messages",)
DPO_KEYS = ("prompt", "chosen", "rejected")
GRPO_KEYS = ("prompt", "responses", "rewards")


@dataclass(frozen=True)
class RawSettings:
    text_field: str = "text"
    """Field (JSON key or CSV column) holding the document text; when a record lacks it, the presets apply."""
    presets: bool = True
    """Auto-detect common layouts when `text_field` is absent: chinese-poetry (title/rhythmic + paragraphs/
    content/para), chat `messages`, dpo `prompt/chosen/rejected`, grpo `prompt/responses/rewards`."""
    txt_mode: str = "blocks"
    """.txt files: "blocks" = one document per blank-line-separated block, "file" = one document per file."""
    records_per_shard: int = 50_000
    """Records per output shard (part-XXXXX.jsonl); a task starts a new shard after this many."""
    task_mb: float = 8.0
    """Input megabytes per task (whole files; a bigger file is a task of its own). Fixed, not derived from the
    worker count, so the shard layout is the same for any number of workers."""
    csv_delimiter: str = ","
    """Field delimiter of .csv files (the first row is the header)."""

    def __post_init__(self):
        if self.txt_mode not in ("blocks", "file"):
            raise ValueError(f"txt_mode must be 'blocks' or 'file', not {self.txt_mode!r}")
        if self.records_per_shard < 1:
            raise ValueError("records_per_shard must be >= 1")


# ---------------------------------------------------------------------------------------------- file listing

def reader_kind(name: str) -> tuple[str | None, bool]:
    """(reader, gzipped) for a file name; reader None when the extension is not one we read."""
    lower = name.lower()
    gz = lower.endswith(".gz")
    if gz:
        lower = lower[:-3]
    return READERS.get(os.path.splitext(lower)[1]), gz


def list_source(source: Path, exclude: Path | None = None) -> tuple[list[tuple[str, str]], list[str]]:
    """([(relpath, abspath)] to read, [relpath skipped]) in sorted order; hidden files and folders are ignored,
    and so is `exclude` (the data root, when it lies inside the source: never ingest our own outputs)."""
    if source.is_file():
        items = [(source.name, str(source))]
    else:
        items = []
        for dirpath, dirnames, filenames in os.walk(source):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")
                           and (exclude is None or Path(dirpath, d).resolve() != exclude)]
            for fn in filenames:
                if not fn.startswith("."):
                    full = os.path.join(dirpath, fn)
                    items.append((Path(os.path.relpath(full, source)).as_posix(), full))
        items.sort()
    read, skipped = [], []
    for rel, full in items:
        try:
            rel.encode("utf-8")
        except UnicodeEncodeError:  # a file name that is not UTF-8 cannot become a record path
            skipped.append(ascii(rel))
            continue
        if reader_kind(rel)[0]:
            read.append((rel, full))
        else:
            skipped.append(rel)
    return read, skipped


def plan_tasks(files: list[tuple[str, str, int]], task_bytes: int) -> list[list[tuple[str, str, int]]]:
    """Groups sorted (rel, path, size) files into consecutive tasks of about task_bytes (at least one file)."""
    tasks, cur, cur_bytes = [], [], 0
    for f in files:
        if cur and cur_bytes + f[2] > task_bytes:
            tasks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(f)
        cur_bytes += f[2]
    if cur:
        tasks.append(cur)
    return tasks


# ---------------------------------------------------------------------------------------------- record mapping

class Rejected(Exception):
    def __init__(self, reason: str, detail: str, line: int | None = None):
        super().__init__(detail)
        self.reason, self.detail, self.line = reason, detail, line


def _lines(value, what: str) -> str:
    """A body given as a string or a list of strings, as text (list items joined with newlines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "\n".join(value)
    raise Rejected("no_text_field", f"'{what}' is neither a string nor a list of strings")


def _check_special(obj: dict) -> dict:
    """The sft/dpo/grpo top-level fields of obj, validated enough that tokenization can rely on them."""
    out = {}
    if "messages" in obj:
        m = obj["messages"]
        if not (isinstance(m, list) and m and all(isinstance(t, dict) and isinstance(t.get("role"), str)
                                                  and isinstance(t.get("content"), str) for t in m)):
            raise Rejected("bad_fields", "'messages' must be a non-empty list of {role: str, content: str}")
        out["messages"] = m
    if all(k in obj for k in DPO_KEYS):
        if not all(isinstance(obj[k], str) for k in DPO_KEYS):
            raise Rejected("bad_fields", "'prompt', 'chosen', 'rejected' must be strings")
        out.update((k, obj[k]) for k in DPO_KEYS)
    if all(k in obj for k in GRPO_KEYS):
        p, resp, rew = obj["prompt"], obj["responses"], obj["rewards"]
        if not (isinstance(p, str) and isinstance(resp, list) and resp and all(isinstance(r, str) for r in resp)
                and isinstance(rew, list) and len(rew) == len(resp)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rew)):
            raise Rejected("bad_fields", "'prompt' must be a string, 'responses' a non-empty list of strings, "
                                         "'rewards' a list of numbers of the same length")
        out.update((k, obj[k]) for k in GRPO_KEYS)
    return out


def _render_special(special: dict) -> str:
    """A plain-text view of sft/dpo/grpo fields, so cleaning and dedup have text to look at."""
    if "messages" in special:
        return "\n\n".join(f"{t['role']}: {t['content']}" for t in special["messages"])
    if "chosen" in special:  # the preferred answer stands for the record; `rejected` is kept, not rendered
        return f"{special['prompt']}\n\n{special['chosen']}"
    return special["prompt"] + "".join(f"\n\n{r}" for r in special["responses"])


def map_record(obj: dict, settings: RawSettings) -> tuple[str, dict, dict]:
    """(text, meta, special top-level fields) of one input object, or raises Rejected."""
    special = _check_special(obj) if ("messages" in obj or "prompt" in obj) else {}
    used = set(special)
    tf = settings.text_field
    if tf in obj:
        text = obj[tf]
        if not isinstance(text, str):
            raise Rejected("no_text_field", f"field '{tf}' is {type(text).__name__}, not a string")
        used.add(tf)
    elif settings.presets and any(k in obj for k in BODY_KEYS):  # chinese-poetry layout
        key = next(k for k in BODY_KEYS if k in obj)
        text = _lines(obj[key], key)
        used.add(key)
        meta = {}
        tkey = next((k for k in TITLE_KEYS if k in obj), None)
        if tkey is not None:
            meta["title"] = obj[tkey]
            used.add(tkey)
            if tkey != "title":
                meta["title_field"] = tkey  # e.g. "rhythmic": the ci tune name stands as the title
        if "author" in obj:
            meta["author"] = obj["author"]
            used.add("author")
        meta.update((k, v) for k, v in obj.items() if k not in used)
        return text, meta, special
    elif special and settings.presets:
        text = _render_special(special)
    else:
        raise Rejected("no_text_field", f"no '{tf}' field" + (" and no known layout" if settings.presets else ""))
    meta = {k: v for k, v in obj.items() if k not in used and k != "metadata"}
    nested = obj.get("metadata")
    if isinstance(nested, dict):  # dolma / common-crawl layout: flatten the nested metadata
        for k, v in nested.items():
            meta[k if k not in meta else f"metadata.{k}"] = v
    elif "metadata" in obj and "metadata" not in used:
        meta["metadata"] = nested
    return text, meta, special


# ---------------------------------------------------------------------------------------------- readers
# Each reader yields ("ok", locator, obj_or_text) or ("bad", locator, (reason, detail, snippet)),
# locator being ("line", n) or ("index", i) or None (whole file).

def _open(path: str, gz: bool):
    return gzip.open(path, "rb") if gz else open(path, "rb")


def _snip(raw) -> str:
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return raw[:SNIPPET_CHARS].encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates -> "?"


def _read_all(path: str, gz: bool) -> bytes:
    with _open(path, gz) as f:
        return f.read()


def _decode_whole(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise Rejected("undecodable_bytes", f"not UTF-8 at byte {e.start} (line {line}): {e.reason}", line) from None
    return text[1:] if text.startswith("\ufeff") else text


def read_jsonl(path: str, gz: bool, settings: RawSettings):
    with _open(path, gz) as f:
        for n, raw in enumerate(f, 1):
            if n == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[3:]
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue
            loc = ("line", n)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield "bad", loc, ("undecodable_bytes", f"not UTF-8 at byte {e.start} of the line: {e.reason}", _snip(raw))
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                yield "bad", loc, ("malformed_json", f"{e.msg} at column {e.colno}", _snip(line))
                continue
            except RecursionError:
                yield "bad", loc, ("malformed_json", "nested too deeply", _snip(line))
                continue
            yield "ok", loc, obj


def read_json(path: str, gz: bool, settings: RawSettings):
    data = _read_all(path, gz)
    try:
        text = _decode_whole(data)
    except Rejected as e:
        yield "bad", ("line", e.line), (e.reason, e.detail, _snip(data))
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        at = lines[e.lineno - 1] if 0 < e.lineno <= len(lines) else text
        yield "bad", ("line", e.lineno), ("malformed_json", f"{e.msg} at line {e.lineno} column {e.colno}", _snip(at))
        return
    except RecursionError:
        yield "bad", ("line", 1), ("malformed_json", "nested too deeply", _snip(text))
        return
    del data, text
    if isinstance(value, dict):
        yield "ok", ("index", 0), value
    elif isinstance(value, list):
        for i, obj in enumerate(value):
            yield "ok", ("index", i), obj
    else:
        yield "bad", ("index", 0), ("not_an_object", f"top-level JSON is {type(value).__name__}, not an object or a list",
                                    _snip(json.dumps(value, ensure_ascii=False)))


def _check_utf8(path: str, gz: bool) -> None:
    """Raises Rejected when the file is not UTF-8 (streaming, so big files are never held in memory)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    consumed, lines = 0, 1
    with _open(path, gz) as f:
        while True:
            chunk = f.read(1 << 20)
            try:
                dec.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:
                start = max(e.start, 0)
                line = lines + chunk.count(b"\n", 0, start)
                raise Rejected("undecodable_bytes", f"not UTF-8 near byte {consumed + start} (line {line}): {e.reason}",
                               line) from None
            if not chunk:
                return
            consumed += len(chunk)
            lines += chunk.count(b"\n")


def read_txt(path: str, gz: bool, settings: RawSettings):
    if settings.txt_mode == "file":
        data = _read_all(path, gz)
        try:
            yield "ok", ("index", 0), _decode_whole(data)
        except Rejected as e:
            yield "bad", ("index", 0), (e.reason, e.detail, _snip(data))
        return
    try:
        _check_utf8(path, gz)  # a .txt that is not UTF-8 is rejected whole, before any of its blocks is emitted
    except Rejected as e:
        yield "bad", ("line", e.line), (e.reason, e.detail, "")
        return
    block, start = [], 0
    with _open(path, gz) as f:
        for n, raw in enumerate(f, 1):
            line = raw.decode("utf-8")
            if n == 1 and line.startswith("\ufeff"):
                line = line[1:]
            line = line.rstrip("\r\n")
            if line.strip():
                if not block:
                    start = n
                block.append(line)
            elif block:
                yield "ok", ("line", start), "\n".join(block)
                block = []
    if block:
        yield "ok", ("line", start), "\n".join(block)


class _LineFeed:
    """Decoded lines for csv.reader, remembering which physical lines the current row used."""

    def __init__(self, f):
        self.f, self.n, self.used, self.bad = f, 0, [], []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        while True:
            raw = next(self.f)
            self.n += 1
            if self.n == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                self.bad.append((self.n, f"not UTF-8 at byte {e.start} of the line: {e.reason}", _snip(raw)))
                continue
            self.used.append(self.n)
            return line


def read_csv(path: str, gz: bool, settings: RawSettings):
    csv.field_size_limit(min(sys.maxsize, 1 << 30))
    with _open(path, gz) as f:
        feed = _LineFeed(f)
        reader = csv.reader(feed, delimiter=settings.csv_delimiter)
        header = None
        while True:
            feed.used = []
            before = feed.n
            try:
                row = next(reader)
                err = None
            except StopIteration:
                row, err = None, None
            except csv.Error as e:
                row, err = [], str(e)
            for n, detail, snippet in feed.bad:
                yield "bad", ("line", n), ("undecodable_bytes", detail, snippet)
            feed.bad = []
            if row is None:
                return
            loc = ("line", feed.used[0] if feed.used else feed.n)
            if err is not None:
                yield "bad", loc, ("malformed_csv_row", err, "")
                if feed.n == before:  # the reader consumed nothing: stop rather than loop
                    return
                continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            if header is None:
                header = row
                continue
            if len(row) != len(header):
                yield "bad", loc, ("malformed_csv_row", f"{len(row)} fields, header has {len(header)}",
                                   _snip(settings.csv_delimiter.join(row)))
                continue
            yield "ok", loc, dict(zip(header, row))


READER_FUNCS = {"jsonl": read_jsonl, "json": read_json, "txt": read_txt, "csv": read_csv}


# ---------------------------------------------------------------------------------------------- one task

class _ShardSink:
    """Writes records of one task into numbered shards, rolling over every `per_shard` records."""

    def __init__(self, folder: Path, per_shard: int):
        self.folder, self.per_shard = folder, per_shard
        self.counts: list[int] = []
        self._w: JsonlWriter | None = None

    def write(self, rec: dict) -> None:
        if self._w is None or self._w.count >= self.per_shard:
            self.close()
            self._w = JsonlWriter(self.folder / shard_name(len(self.counts)))
        self._w.write(rec)

    def close(self) -> None:
        if self._w is not None:
            self._w.close()
            self.counts.append(self._w.count)
            self._w = None


def ingest_task(args: tuple) -> dict:
    """Reads the files of one task into `folder` (shards + rejected.jsonl); returns per-file counts."""
    files, folder, settings = args
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sink = _ShardSink(folder, settings.records_per_shard)
    per_file = []
    with open(folder / REJECTED_FILE, "w", encoding="utf-8") as rej:
        for rel, path, size in files:
            kind, gz = reader_kind(rel)
            counts = Counter()
            ok = bad = 0

            def reject(loc, reason, detail, snippet):
                nonlocal bad
                entry = {"path": rel}
                entry.update([loc] if loc is not None else [("line", None)])  # None: the whole file
                entry.update(reason=reason, detail=detail, snippet=snippet)
                rej.write(dumps(entry) + "\n")
                counts[reason] += 1
                bad += 1

            last = None
            try:
                for status, loc, item in READER_FUNCS[kind](path, gz, settings):
                    last = loc
                    if status == "bad":
                        reject(loc, *item)
                        continue
                    if kind == "txt":  # the txt reader yields the text itself
                        text, meta, special = item, {}, {}
                    elif not isinstance(item, dict):
                        reject(loc, "not_an_object", f"JSON value is {type(item).__name__}, not an object",
                               _snip(json.dumps(item, ensure_ascii=False)))
                        continue
                    else:
                        try:
                            text, meta, special = map_record(item, settings)
                        except Rejected as e:
                            reject(loc, e.reason, e.detail, _snip(json.dumps(item, ensure_ascii=False)))
                            continue
                    rec = {"id": record_id(rel, **{loc[0]: loc[1]}), "text": text, "meta": meta,
                           "source": {"path": rel, loc[0]: loc[1]}}
                    rec.update(special)
                    try:
                        sink.write(rec)
                    except UnicodeEncodeError as e:  # a JSON "\\ud800" escape: a lone surrogate is not text
                        reject(loc, "undecodable_bytes", f"lone surrogate in the record: {e.reason}",
                               _snip(json.dumps(item, ensure_ascii=False)))
                        continue
                    ok += 1
            except (OSError, EOFError, zlib.error) as e:  # unreadable, truncated or corrupt gzip
                where = None
                if last is not None and last[0] == "line":
                    where = ("line", last[1] + 1)
                reject(where, "unreadable_file", f"{type(e).__name__}: {e}", "")
            per_file.append({"path": rel, "records": ok, "rejected": bad, "bytes": size,
                             "rejected_by_reason": dict(sorted(counts.items()))})
    sink.close()
    return {"folder": str(folder), "shards": sink.counts, "files": per_file}


# ---------------------------------------------------------------------------------------------- the stage

def ingest(source: Path, out_dir: Path, settings: RawSettings = RawSettings(), workers: int | None = None,
           log=None, exclude: Path | None = None) -> dict:
    """Reads `source` (a file, or a folder searched recursively) into record shards in `out_dir`.

    Writes part-XXXXX.jsonl, _rejected.jsonl (every bad line/record/file with a reason) and _stats.json;
    returns the stats. Raises FileNotFoundError before any work when `source` does not exist.
    """
    t0 = time.perf_counter()
    source, out_dir = Path(source), Path(out_dir)
    if not source.exists():
        raise FileNotFoundError(f"corpus source does not exist: {source}")
    out_dir.mkdir(parents=True, exist_ok=True)
    read, skipped = list_source(source, Path(exclude).resolve() if exclude else None)
    files = []
    for rel, full in read:
        try:
            size = os.path.getsize(full)
        except OSError:
            size = 0
        files.append((rel, full, size))
    if skipped and log is not None:
        log.warning(f"raw_records: skipped {len(skipped)} files (unknown extension or a file name that is not "
                    f"UTF-8), e.g. {skipped[:5]}")
    tasks = plan_tasks(files, max(1, int(settings.task_mb * 1024 * 1024)))
    args = [(t, str(out_dir / f".task-{i:05d}"), settings) for i, t in enumerate(tasks)]
    progress = Progress("raw_records", total=len(files), unit="files", log=log)

    n_shard, rejected_parts, per_file, by_reason = 0, [], [], Counter()
    try:
        for res in map_ordered(ingest_task, args, workers):
            folder = Path(res["folder"])
            for i, _ in enumerate(res["shards"]):
                os.replace(folder / shard_name(i), out_dir / shard_name(n_shard))
                n_shard += 1
            rejected_parts.append(folder / REJECTED_FILE)
            for f in res["files"]:
                per_file.append(f)
                by_reason.update(f["rejected_by_reason"])
            progress.advance(len(res["files"]))
        concat_files(rejected_parts, out_dir / REJECTED_FILE)
    finally:
        for a in args:
            shutil.rmtree(a[1], ignore_errors=True)
    progress.finish()

    docs_out = sum(f["records"] for f in per_file)
    n_rejected = sum(by_reason.values())
    stats = {
        "docs_in": docs_out + n_rejected,
        "docs_out": docs_out,
        **{f"dropped_{r}": by_reason.get(r, 0) for r in sorted(set(REASONS) | set(by_reason))},
        "rejected": n_rejected,
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "files_read": len(per_file),
        "files": per_file,
        "skipped_files": skipped,
        "bytes_read": sum(f["bytes"] for f in per_file),
        "shards": n_shard,
        "tasks": len(tasks),
        "source": str(source),
        "settings": asdict(settings),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    atomic_write_json(out_dir / STATS_FILE, stats)
    return stats
