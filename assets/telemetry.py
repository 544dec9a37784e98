"""funnel_telemetry: the whole-run funnel as a file, a markdown table and a chart in the Dagster UI."""

import base64
import time

import dagster as dg

from resources import DataRoot
from tokenmill.common.io import atomic_write_json, staged_output
from tokenmill.telemetry import build_funnel, funnel_chart_png, funnel_markdown, history_row

HISTORY_RUNS = 10  # materializations shown in the "how counts moved" chart


def previous_history_rows(context: dg.AssetExecutionContext) -> list[dict]:
    """Stage counts of the last materializations, oldest first, from this asset's own metadata."""
    result = context.instance.fetch_materializations(context.asset_key, limit=HISTORY_RUNS - 1)
    rows = []
    for record in result.records:
        entry = record.asset_materialization.metadata.get("history_row") if record.asset_materialization else None
        if entry is not None:
            rows.append(entry.value)
    return rows[::-1]


@dg.asset(
    group_name="report",
    kinds={"python", "json"},
    deps=["raw_records", "cleaned_jsonl", "dedup_report", "deduped_jsonl", "tokenizer", "tokenized_bins"],
    code_version="1",
)
def funnel_telemetry(context: dg.AssetExecutionContext, data_root: DataRoot) -> dg.MaterializeResult:
    """The data funnel of the whole run: records kept and dropped per stage, tokens, split and bytes.

    Built from the `_stats.json` each stage measured. `funnel.json` is machine-readable; the chart shows
    the funnel as bars and how the counts moved over the last materializations.
    """
    start = time.perf_counter()
    funnel = build_funnel(data_root.path(""))
    row = history_row(funnel)
    with staged_output(data_root.path("funnel_telemetry")) as out:
        atomic_write_json(out / "funnel.json", funnel)
        chart = funnel_chart_png(funnel, previous_history_rows(context), out / "funnel.png")
        png = chart.read_bytes()
    final = data_root.path("funnel_telemetry")
    image = f"![funnel](data:image/png;base64,{base64.b64encode(png).decode()})"
    return dg.MaterializeResult(metadata={
        "funnel": dg.MetadataValue.md(funnel_markdown(funnel)),
        "chart": dg.MetadataValue.md(image),
        "history_row": dg.MetadataValue.json(row),
        "raw_records": row["input"],
        **{f"records_{s['stage']}": s["docs_out"] for s in funnel["stages"]},
        "tokens": funnel["tokens"]["total"],
        "supervised_share": round(funnel["tokens"]["supervised_share"], 4),
        "conserved": funnel["conserved"],
        "seconds": round(time.perf_counter() - start, 3),
        "path": dg.MetadataValue.path(str(final / "funnel.json")),
        "chart_path": dg.MetadataValue.path(str(final / "funnel.png")),
    })
