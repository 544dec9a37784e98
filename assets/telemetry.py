"""funnel_telemetry: the whole-run funnel as a file, a markdown table and a chart in the Dagster UI."""

import time

import dagster as dg

from assets.checks import FUNNEL_CONSERVED, funnel_conserved, publish_only_if_passed
from assets.clean import cleaned_jsonl
from assets.dedup import deduped_jsonl
from assets.metadata import funnel_metadata
from assets.raw import raw_records
from assets.tokenize import tokenized_bins, tokenizer
from resources import DataRoot
from tokenmill.common.io import atomic_write_json, staged_output
from tokenmill.stages import telemetry
from tokenmill.stages.funnel_chart import funnel_chart_svg
from tokenmill.stages.registry import DEDUP_REPORT
from tokenmill.stages.telemetry import build_funnel, history_row

HISTORY_RUNS = 10  # materializations shown in the "how counts moved" chart


def previous_history_rows(context: dg.AssetExecutionContext, source: str | None) -> list[dict]:
    """Stage counts of the last materializations built from `source`, oldest first, from this asset's own
    metadata (an instance that has seen other corpora never draws them on one line)."""
    result = context.instance.fetch_materializations(context.asset_key, limit=HISTORY_RUNS - 1)
    rows = []
    for record in result.records:
        entry = record.asset_materialization.metadata.get("history_row") if record.asset_materialization else None
        if entry is not None and entry.value.get("source") == source:
            rows.append(entry.value)
    return rows[::-1]


@dg.asset(
    group_name="report",
    kinds={"python", "json"},
    deps=[raw_records, cleaned_jsonl, DEDUP_REPORT.key, deduped_jsonl, tokenizer, tokenized_bins],
    code_version=telemetry.VERSION,
    check_specs=[FUNNEL_CONSERVED],
)
def funnel_telemetry(context: dg.AssetExecutionContext, data_root: DataRoot):
    """The data funnel of the whole run: records kept and dropped per stage, tokens, split and bytes.

    Built from the `_stats.json` each stage measured. `funnel.json` is machine-readable; the page shows the funnel
    with bars (each stage's share of the input), the drops per reason and per language, the tokens and every
    batch's counts, its Plots view how the counts moved across materializations, and `chart` draws both
    (`funnel.svg`, embedded in the page: Show Markdown).
    """
    start = time.perf_counter()
    funnel = build_funnel(data_root.path(""))
    history = {**history_row(funnel), "source": funnel.source}
    check = funnel_conserved(funnel)
    with staged_output(data_root.path("funnel_telemetry")) as out:
        atomic_write_json(out / "funnel.json", funnel.to_json())
        funnel_chart_svg(funnel, previous_history_rows(context, funnel.source), out / "funnel.svg")
        yield from publish_only_if_passed(check)  # blocking: a funnel that loses records would mark its batch done
    metadata = funnel_metadata(funnel, history, data_root.path("funnel_telemetry"))
    yield dg.MaterializeResult(
        metadata={**metadata, "seconds": round(time.perf_counter() - start, 3)}, check_results=[check]
    )
