"""Stage summaries -> Dagster metadata: the one place that decides what each asset shows in the UI.

Every stage function returns plain stats (docs_in, docs_out, dropped_<reason>, seconds, ...); the assets pass
them here. Tables are built as pandas DataFrames and shown as Dagster tables or markdown.
"""
from __future__ import annotations

from pathlib import Path

import dagster as dg
import pandas as pd

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
