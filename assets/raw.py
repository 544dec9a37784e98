"""raw_records: the source corpus read into normalized record JSONL shards (bad input rejected with a reason)."""

import json

import dagster as dg
from pydantic import Field

from resources import CorpusSource, DataRoot
from tokenmill.common.io import iter_jsonl, record_shards, staged_output
from tokenmill.raw import RawSettings, ingest

MAX_FILE_ROWS = 50  # per-file rows in the UI table; _stats.json lists every file
PREVIEW_RECORDS = 5
PREVIEW_CHARS = 120


class RawConfig(dg.Config):
    text_field: str = Field(default=RawSettings.text_field,
                            description="JSON key / CSV column holding the text; without it the layout presets apply")
    presets: bool = Field(default=RawSettings.presets,
                          description="Auto-detect chinese-poetry (title/rhythmic + paragraphs/content/para), "
                                      "chat messages, dpo and grpo layouts when the text field is absent")
    txt_mode: str = Field(default=RawSettings.txt_mode,
                          description="'.txt' files: 'blocks' = one record per blank-line-separated block, 'file' = one per file")
    records_per_shard: int = Field(default=RawSettings.records_per_shard, description="Records per part-XXXXX.jsonl shard")
    task_mb: float = Field(default=RawSettings.task_mb, description="Input megabytes per parallel task (whole files)")
    csv_delimiter: str = Field(default=RawSettings.csv_delimiter, description="Field delimiter of .csv files (header row first)")


def _cell(text: str) -> str:
    text = str(text).replace("\n", " / ").replace("|", "\\|")
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


def _preview_md(folder) -> str:
    rows = []
    for shard in record_shards(folder):
        for rec in iter_jsonl(shard):
            src = rec["source"]
            loc = src.get("line", src.get("index"))
            rows.append(f"| {rec['id']} | {_cell(src['path'])}:{loc} | {_cell(json.dumps(rec['meta'], ensure_ascii=False))} "
                        f"| {_cell(rec['text'])} |")
            if len(rows) >= PREVIEW_RECORDS:
                break
        break
    return "| id | source | meta | text |\n|---|---|---|---|\n" + "\n".join(rows) if rows else "no records"


@dg.asset(group_name="ingest", kinds={"python", "jsonl"}, code_version="1")
def raw_records(context: dg.AssetExecutionContext, config: RawConfig, source: CorpusSource,
                data_root: DataRoot) -> dg.MaterializeResult:
    """Every record of the source (TOKENMILL_SOURCE: a file or a folder of .jsonl/.json/.txt/.csv, .gz too) as
    `{"id", "text", "meta", "source"}` JSONL shards with stable ids. Malformed lines, records without text,
    undecodable bytes and unreadable files go to `_rejected.jsonl` with path, line and reason."""
    src = source.resolved()  # a missing source is a clear error before any work
    with staged_output(data_root.path("raw_records")) as out:
        stats = ingest(src, out, RawSettings(**config.model_dump()), log=context.log,
                       exclude=data_root.path(""))
    final = data_root.path("raw_records")
    files = stats["files"]
    cols = ["path", "records", "rejected", "bytes"]
    table = [dg.TableRecord({k: f[k] for k in cols}) for f in files[:MAX_FILE_ROWS]]
    if len(files) > MAX_FILE_ROWS:
        rest = files[MAX_FILE_ROWS:]
        table.append(dg.TableRecord({"path": f"... and {len(rest)} more files", "records": sum(f["records"] for f in rest),
                                     "rejected": sum(f["rejected"] for f in rest), "bytes": sum(f["bytes"] for f in rest)}))
    return dg.MaterializeResult(metadata={
        "docs_in": stats["docs_in"],
        "docs_out": dg.MetadataValue.int(stats["docs_out"]),
        **{k: v for k, v in stats.items() if k.startswith("dropped_")},
        "rejected_by_reason": dg.MetadataValue.json(stats["rejected_by_reason"]),
        "files_read": stats["files_read"],
        "skipped_files": len(stats["skipped_files"]),
        "files": dg.MetadataValue.table(
            records=table,
            schema=dg.TableSchema(columns=[dg.TableColumn(k, "string" if k == "path" else "int") for k in cols])),
        "bytes_read": stats["bytes_read"],
        "shards": stats["shards"],
        "seconds": stats["seconds"],
        "source": str(src),
        "path": dg.MetadataValue.path(str(final)),
        "preview": dg.MetadataValue.md(_preview_md(final)),
    })
