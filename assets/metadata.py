"""Stage summaries -> Dagster metadata: the one place that decides what each asset shows in the UI.

Every stage function returns plain stats (docs_in, docs_out, dropped_<reason>, seconds, ...); the assets pass
them here. Tables are built as pandas DataFrames and shown as Dagster tables or markdown.
"""
from __future__ import annotations

import base64
import itertools
import json
from pathlib import Path

import dagster as dg
import pandas as pd

from tokenmill.common.io import iter_jsonl, record_shards

CELL_CHARS = 100  # characters of free text shown in one table cell


def cell(text, width: int = CELL_CHARS) -> str:
    """One markdown table cell: newlines shown as ' / ', pipes escaped, long text cut with an ellipsis."""
    text = str("" if text is None else text).replace("\n", " / ").replace("|", "\\|")
    return text if len(text) <= width else text[:width] + "…"


def markdown_table(frame: pd.DataFrame) -> dg.MetadataValue:
    """A small DataFrame as a markdown table (free-text cells go through `cell` first)."""
    if frame.empty:
        return dg.MetadataValue.md("nothing to show")
    header = "| " + " | ".join(map(str, frame.columns)) + " |\n|" + "---|" * len(frame.columns)
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return dg.MetadataValue.md("\n".join([header, *rows]))


def dagster_table(frame: pd.DataFrame) -> dg.MetadataValue:
    """A DataFrame as a Dagster table (sortable in the UI); integer columns typed int, the rest string."""
    columns = [dg.TableColumn(str(c), "int" if pd.api.types.is_integer_dtype(frame[c]) else
                              "float" if pd.api.types.is_float_dtype(frame[c]) else "string") for c in frame.columns]
    records = [dg.TableRecord({str(k): (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
               for row in frame.to_dict(orient="records")]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))


def stage_counts(stats: dict, path: Path) -> dict:
    """The keys every stage shows: docs_in, docs_out, dropped_<reason>, seconds, path."""
    return {
        "docs_in": dg.MetadataValue.int(stats["docs_in"]),
        "docs_out": dg.MetadataValue.int(stats["docs_out"]),
        **{k: dg.MetadataValue.int(v) for k, v in sorted(stats.items()) if k.startswith("dropped_")},
        "seconds": dg.MetadataValue.float(float(stats["seconds"])),
        "path": dg.MetadataValue.path(str(path)),
    }


def funnel_metadata(funnel: dict, history: dict, chart_png: bytes, folder: Path) -> dict:
    """The funnel as two tables (records per stage, tokens) and the chart, inline in the UI."""
    first = funnel["stages"][0]
    raw = first["docs_in"] or 1
    stages = pd.DataFrame(
        [("input records", f"{first['docs_in']:,}", "100.00%", "")]
        + [(s["label"], f"{s['docs_out']:,}", f"{100 * s['docs_out'] / raw:.2f}%",
            ", ".join(f"{k}: {v:,}" for k, v in s["dropped"].items() if v) or "-") for s in funnel["stages"]],
        columns=["stage", "records", "share of raw", "dropped"])
    t = funnel["tokens"]
    tokens = [("total", f"{t['total']:,}", "100.00%"),
              ("supervised", f"{t['supervised']:,}", f"{100 * t['supervised_share']:.2f}%"),
              ("masked (-100)", f"{t['masked']:,}", f"{100 * t['masked_share']:.2f}%")]
    if t.get("isolated_punctuation_share") is not None:
        tokens.append(("isolated punctuation", "", f"{100 * t['isolated_punctuation_share']:.2f}%"))
    tokens += [(f"{name} split", f"{split.get('tokens', 0):,} tokens", f"{split.get('records', 0):,} records")
               for name, split in funnel["split"].items() if split]
    conservation = ("Every stage conserves records (in = out + dropped)." if funnel["conserved"]
                    else "**A stage does not conserve records: see funnel.json.**")
    funnel_md = "\n\n".join([markdown_table(stages).value,
                              markdown_table(pd.DataFrame(tokens, columns=["tokens", "count", "share"])).value,
                              conservation])
    return {
        "funnel": dg.MetadataValue.md(funnel_md),
        "chart": dg.MetadataValue.md(f"![funnel](data:image/png;base64,{base64.b64encode(chart_png).decode()})"),
        "history_row": dg.MetadataValue.json(history),
        "raw_records": history["input"],
        **{f"records_{s['stage']}": s["docs_out"] for s in funnel["stages"]},
        "tokens": t["total"],
        "supervised_share": round(t["supervised_share"], 4),
        "conserved": funnel["conserved"],
        "path": dg.MetadataValue.path(str(folder / "funnel.json")),
        "chart_path": dg.MetadataValue.path(str(folder / "funnel.png")),
    }


RAW_FILE_ROWS = 50  # per-file rows in the raw_records UI table; _stats.json lists every file
RAW_PREVIEW_RECORDS = 5
RAW_PREVIEW_CHARS = 120


def _raw_files_frame(files: list[dict]) -> pd.DataFrame:
    cols = ["path", "records", "rejected", "bytes"]
    frame = pd.DataFrame(files[:RAW_FILE_ROWS], columns=cols)
    rest = pd.DataFrame(files[RAW_FILE_ROWS:], columns=cols)
    if len(rest):
        more = {"path": f"... and {len(rest)} more files", **{c: int(rest[c].sum()) for c in cols[1:]}}
        frame = pd.concat([frame, pd.DataFrame([more])], ignore_index=True)
    return frame


def _raw_preview_frame(folder: Path) -> pd.DataFrame:
    """The first records of the first shard: id, source path:locator, meta, text."""
    rows = []
    for shard in record_shards(folder)[:1]:
        for rec in itertools.islice(iter_jsonl(shard), RAW_PREVIEW_RECORDS):
            src = rec["source"]
            rows.append({"id": rec["id"], "source": cell(f"{src['path']}:{src.get('line', src.get('index'))}",
                                                         RAW_PREVIEW_CHARS),
                         "meta": cell(json.dumps(rec["meta"], ensure_ascii=False), RAW_PREVIEW_CHARS),
                         "text": cell(rec["text"], RAW_PREVIEW_CHARS)})
    return pd.DataFrame(rows, columns=["id", "source", "meta", "text"])


def raw_records_metadata(stats: dict, path: Path) -> dict:
    """raw_records: the counts, rejections by reason, a per-file table and a preview of the first records."""
    return {
        **stage_counts(stats, path),
        "rejected_by_reason": dg.MetadataValue.json(stats["rejected_by_reason"]),
        "files_read": stats["files_read"],
        "skipped_files": len(stats["skipped_files"]),
        "files": dagster_table(_raw_files_frame(stats["files"])),
        "bytes_read": stats["bytes_read"],
        "shards": stats["shards"],
        "source": stats["source"],
        "preview": markdown_table(_raw_preview_frame(path)),
    }


CLEAN_TOP_LINES = 15  # boilerplate lines shown in the cleaned_jsonl UI table; _stats.json keeps 50


def cleaned_jsonl_metadata(stats: dict, path: Path) -> dict:
    """cleaned_jsonl: the counts, repairs, the top boilerplate lines, before/after examples, length histogram."""
    bp = stats["boilerplate"]
    top = pd.DataFrame(bp["top_lines"][:CLEAN_TOP_LINES],
                       columns=["line", "count", "score", "df", "position", "template", "short"])
    top["line"] = top["line"].map(cell)
    examples = pd.DataFrame([{"id": e["id"], "change": e["kind"], "before": cell(e["before"]),
                              "after": cell(e["after"])} for e in stats["examples"]],
                            columns=["id", "change", "before", "after"])
    lengths = pd.DataFrame({"characters": stats["length_buckets"], "records before": stats["length_hist_before"],
                            "records after": stats["length_hist_after"]})
    return {
        **stage_counts(stats, path),
        "mojibake_repaired": stats["mojibake_repaired"],
        "docs_meta_extracted": stats["docs_meta_extracted"],
        "boilerplate_lines_stripped": bp["lines_stripped"],
        "boilerplate_docs_touched": bp["docs_touched"],
        "boilerplate_top_lines": dagster_table(top),
        "examples": markdown_table(examples),
        "length_distribution": markdown_table(lengths),
        "chars_in": stats["chars_in"],
        "chars_out": stats["chars_out"],
    }
