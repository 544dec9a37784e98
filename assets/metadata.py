"""Stage results -> Dagster metadata: the one place that decides what each asset shows in the UI.

Every stage function returns a typed result (a tokenmill.common.results.StageResult: docs_in, docs_out, dropped
per reason, seconds, and the stage's own figures); the assets pass it here. Tables are `Table`s (named columns,
rows) shown as Dagster tables or markdown.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import dagster as dg

from tokenmill.batches import REGISTRY_FILE, read_registry
from tokenmill.common import disk
from tokenmill.common.io import iter_jsonl, record_shards
from tokenmill.common.results import StageResult
from tokenmill.explain import word_diff
from tokenmill.stages.clean import CleanResult
from tokenmill.stages.dedup import DedupApplyResult, DedupResult
from tokenmill.stages.raw import RawResult
from tokenmill.stages.telemetry import Funnel
from tokenmill.stages.tokenize import TokenizeResult, TokenizerResult

CELL_CHARS = 100  # characters of free text shown in one table cell
SAMPLE_CELL_CHARS = 160  # characters of a dropped record's text in the drop samples tables
SAMPLES_SHOWN = 5  # drop samples per reason in the UI tables (_stats.json and the rejected file keep more)
# a token's whitespace made visible in the tokenizer examples
PIECE_MARKS = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥"})


def plain_cell(text, width: int = CELL_CHARS) -> str:
    """One Dagster table cell (plain text): line breaks of any kind shown as ' / ', long text cut with an ellipsis."""
    text = " / ".join(str("" if text is None else text).splitlines())
    return text if len(text) <= width else text[:width] + "…"


def cell(text, width: int = CELL_CHARS) -> str:
    """One markdown table cell: `plain_cell`, then pipes and angle brackets escaped (`<s>` would be read as an
    HTML tag and vanish)."""
    return plain_cell(text, width).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


LONGEST_RUN = 40  # characters of a run without spaces shown as is; a longer one may wrap after . / = ( ,
BREAK_AFTER = re.compile(r"([./=(,])(?=\S)")


def wrappable(text, longest: int = LONGEST_RUN) -> str:
    """`text` with a zero-width space after the punctuation of each run longer than `longest` characters
    (`hashfunc=tokenmill.stages...`), where a browser may then wrap it instead of pushing the table off the page.
    For descriptive text only: a path or an id someone copies must keep its exact characters."""
    return re.sub(rf"\S{{{longest + 1},}}", lambda m: BREAK_AFTER.sub("\\1\u200b", m.group(0)), str(text))


def where(entry: dict) -> str:
    """path:line (or :index) of a drop entry: a stage's rejected entry names its `source`, raw_records' its own."""
    src = entry.get("source") or entry
    at = src.get("line", src.get("index"))
    return f"{src.get('path')}:{'' if at is None else at}"


def drop_samples_table(samples: dict, text_key: str = "text") -> dg.MetadataValue:
    """The first dropped records of each reason as a Dagster table of two columns, so the text keeps its place on a
    1600 px window: where and why (file:line, the reason and the rule's detail) and the text (raw_records: the
    snippet of the bad input)."""
    rows = [
        {
            "record and reason": plain_cell(where(e), 60)
            + " "
            + plain_cell(f"{reason}: {e['detail']}" if e.get("detail") else reason, 100),
            "text": plain_cell(e.get(text_key), SAMPLE_CELL_CHARS),
        }
        for reason, entries in sorted(samples.items())
        for e in entries[:SAMPLES_SHOWN]
    ]
    return dagster_table(table(rows, ["record and reason", "text"]))


@dataclass(frozen=True)
class Table:
    """Rows of values under named columns: what the UI tables are built from (a plain type: pandas was a slow
    import for these few rows; docs/profile.md, 'A one-file update of the demo corpus')."""

    columns: list[str]
    rows: list[tuple]

    def records(self) -> list[dict]:
        return [dict(zip(self.columns, row)) for row in self.rows]

    def column(self, name: str) -> list:
        i = self.columns.index(name)
        return [row[i] for row in self.rows]


def table(rows: Iterable[Sequence | dict], columns: Sequence[str]) -> Table:
    """A Table of rows given as tuples in column order or as dicts by column (a missing key: an empty cell)."""
    columns = list(columns)
    return Table(columns, [tuple(r.get(c) for c in columns) if isinstance(r, dict) else tuple(r) for r in rows])


def markdown_table(t: Table) -> dg.MetadataValue:
    """A small table as markdown (free-text cells go through `cell` first). The UI shows markdown inline only under
    1,000 characters (longer hides behind "Show Markdown"): longer tables are `dagster_table`s, which always show
    inline, as plain text."""
    if not t.rows:
        return dg.MetadataValue.md("nothing to show")
    header = "| " + " | ".join(t.columns) + " |\n|" + "---|" * len(t.columns)
    rows = ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in t.rows]
    return dg.MetadataValue.md("\n".join([header, *rows]))


def _column_type(values: list) -> str:
    """int when every value is an integer, float when every value is a number and one is not an integer, else
    string (the UI sorts int and float columns as numbers)."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) < len(values) or not values:
        return "string"
    return "int" if all(isinstance(v, int) for v in numbers) else "float"


def dagster_table(t: Table) -> dg.MetadataValue:
    """A table as a Dagster table (sortable in the UI), each column typed by its values (_column_type)."""
    types = {c: _column_type(t.column(c)) for c in t.columns}
    records = [
        dg.TableRecord({c: (float(v) if types[c] == "float" else v) for c, v in row.items()}) for row in t.records()
    ]
    columns = [dg.TableColumn(c, types[c]) for c in t.columns]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))


def source_metadata(path: Path) -> dict:
    """Which corpus an output was built from (the source path and generation of the data root's batch registry),
    so the UI tells corpora apart when one instance has seen several."""
    for root in Path(path).parents:
        if (root / REGISTRY_FILE).exists():
            registry = read_registry(root)
            return {
                "source": dg.MetadataValue.path(registry.source or ""),  # as dagster shows None
                "source_generation": dg.MetadataValue.int(registry.generation),
                "source_batches": dg.MetadataValue.int(len(registry.batches)),
            }
    return {}


def disk_metadata(folder: Path) -> dict:
    """What the stage keeps on disk: `bytes_written` (the files of its output, each counted once: a batch's folder
    `<data root>/<stage>/<batch>`, or a whole-corpus stage's folder), `input_bytes` (the source bytes they come
    from: that batch's, or every batch's) and `bytes_per_input_byte`; {} outside a data root."""
    folder = Path(folder)
    root = next((r for r in folder.parents if (r / REGISTRY_FILE).exists()), None)
    if root is None or not folder.exists():
        return {}
    batch = folder.name if folder.parent.parent == root else None
    source = disk.batch_input_bytes(root, batch) if batch else disk.input_bytes(root)
    written = disk.tree_bytes(folder)
    return {
        "bytes_written": dg.MetadataValue.int(written),
        "input_bytes": dg.MetadataValue.int(source or 0),
        "bytes_per_input_byte": dg.MetadataValue.float(disk.per_input(written, source or 0)),
    }


def data_root_disk_metadata(root: Path) -> dict:
    """The data root's bytes on disk (each file once) per stage and in total, and per input byte; {} when `root`
    is not a data root."""
    root = Path(root)
    if not (root / REGISTRY_FILE).exists():
        return {}
    source, stages = disk.input_bytes(root), disk.stage_bytes(root)
    total = disk.tree_bytes(root)
    rows = [(k, n, disk.per_input(n, source)) for k, n in stages.items()] + [
        ("data root", total, disk.per_input(total, source))
    ]
    return {
        "disk_per_stage": dagster_table(table(rows, ["stage", "bytes", "bytes per input byte"])),
        "data_root_bytes": dg.MetadataValue.int(total),
        "data_root_per_input": dg.MetadataValue.float(disk.per_input(total, source)),
    }


def stage_counts(result: StageResult, path: Path) -> dict:
    """The keys every stage shows: docs_in, docs_out, dropped_<reason>, seconds, path, and the source it came from."""
    return {
        **source_metadata(path),
        "docs_in": dg.MetadataValue.int(result.docs_in),
        "docs_out": dg.MetadataValue.int(result.docs_out),
        **{f"dropped_{reason}": dg.MetadataValue.int(n) for reason, n in sorted(result.dropped.items())},
        "seconds": dg.MetadataValue.float(float(result.seconds)),
        "path": dg.MetadataValue.path(str(path)),
    }


FUNNEL_BAR = 24  # characters of the input's bar in the inline funnel chart (more would not fit a 1600 px window)
# a bar's last character in eighths of a character: 1% of the input is a quarter of a character on a 24-character
# bar, so a stage that drops a percent or two is visibly shorter than the one before
EIGHTHS = ("", "▏", "▎", "▍", "▌", "▋", "▊", "▉")


def text_bar(n: int, of: int, width: int) -> str:
    """`n` as a bar of block characters on a scale where `of` fills `width` characters."""
    eighths = round(8 * width * n / of) if of else 0
    return "█" * (eighths // 8) + EIGHTHS[eighths % 8]


def svg_image(path: Path, alt: str) -> dg.MetadataValue:
    """An SVG image shown in the page itself (a data: URI in Markdown), so it opens from the browser, not only on the
    machine that wrote it."""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return dg.MetadataValue.md(f"![{alt}](data:image/svg+xml;base64,{data})")


def funnel_metadata(funnel: Funnel, history: dict, folder: Path) -> dict:
    """The funnel inline in the UI: records per stage with bars, drops per reason (and per language) and tokens as
    tables, per batch, the chart, and the counts as numeric entries, which the asset page's Plots view draws across
    materializations."""
    raw = funnel.stages[0].docs_in
    counts = [("input records", raw)] + [(s.label, s.docs_out) for s in funnel.stages]
    chart = table(
        [(label, f"{n:,}", f"{100 * n / (raw or 1):.2f}%", text_bar(n, raw, FUNNEL_BAR)) for label, n in counts],
        ["stage", "records", "share of input", ""],
    )
    dropped = table(
        [(s.label, reason, n) for s in funnel.stages for reason, n in s.dropped.items() if n],
        ["stage", "reason", "records"],
    )
    t = funnel.tokens
    tokens = [
        ("total", f"{t.total:,}", "100.00%"),
        ("supervised", f"{t.supervised:,}", f"{100 * t.supervised_share:.2f}%"),
        ("masked (-100)", f"{t.masked:,}", f"{100 * t.masked_share:.2f}%"),
    ]
    if t.isolated_punctuation_share is not None:
        tokens.append(("isolated punctuation", "", f"{100 * t.isolated_punctuation_share:.2f}%"))
    tokens += [
        (f"{name} split", f"{split.get('tokens', 0):,} tokens", f"{split.get('records', 0):,} records")
        for name, split in funnel.split.items()
        if split
    ]
    token_md = markdown_table(table(tokens, ["tokens", "count", "share"])).value
    chart_file = Path(folder) / "funnel.svg"
    return {
        **source_metadata(folder),
        "funnel": markdown_table(chart),
        "dropped": dagster_table(dropped),
        **dropped_by_language_table(funnel.dropped_by_language),
        "token_counts": dg.MetadataValue.md(f"{token_md}\n\n{conservation(funnel)}"),
        "batches": dagster_table(batches_table(funnel)),
        **languages_table(
            [asdict(r) for r in funnel.languages], ["records_cleaned", "records_tokenized", "tokens", "token_share"]
        ),
        **({"chart": svg_image(chart_file, "funnel.svg")} if chart_file.exists() else {}),
        "pii_masked": dg.MetadataValue.json(funnel.pii_masked),
        "history_row": dg.MetadataValue.json(history),
        "input_records": raw,
        **{f"records_{s.stage}": s.docs_out for s in funnel.stages},
        "tokens": t.total,
        "supervised_share": round(t.supervised_share, 4),
        "conserved": funnel.conserved,
        **disk_metadata(folder),
        **data_root_disk_metadata(Path(folder).parent),
        "path": dg.MetadataValue.path(str(folder / "funnel.json")),
        "chart_path": dg.MetadataValue.path(str(chart_file)),
    }


def conservation(funnel: Funnel) -> str:
    """One line under the token counts: every stage conserves records, or which do not (in total, per batch)."""
    if funnel.conserved:
        return "Every stage conserves records (in = out + dropped)."
    broken = [s.label for s in funnel.stages if not s.conserved_and_linked]
    broken += [f"batch {b.batch}" for b in funnel.batches if not b.conserved]
    return f"**Records are not conserved ({', '.join(broken)}): see funnel.json.**"


def dropped_by_language_table(by_language: dict[str, dict[str, int]]) -> dict:
    """`dropped_by_language`: per meta.language, the records cleaning dropped and by which rule, most first;
    nothing when the stats do not break drops down by language."""
    rows = [
        (
            language,
            f"{sum(reasons.values()):,}",
            ", ".join(f"{r} {n:,}" for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])) if n),
        )
        for language, reasons in sorted(by_language.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
        if sum(reasons.values())
    ]
    if not rows:
        return {}
    return {"dropped_by_language": markdown_table(table(rows, ["language", "dropped", "by rule"]))}


def languages_table(rows: list[dict], columns: list[str]) -> dict:
    """`languages`: one row per meta.language (cleaned_jsonl: records and characters; the funnel: records and
    tokens); nothing when language identification was off."""
    if not rows:
        return {}
    # "records cleaned", not "records_cleaned": a header the browser can wrap keeps the table on the page
    t = table(rows, ["language", *columns])
    return {"languages": dagster_table(Table([c.replace("_", " ") for c in t.columns], t.rows))}


def batches_table(funnel: Funnel) -> Table:
    """One row per source batch, every batch: its input and the records after each stage, then tokens, with
    thousands separators like the other tables. Columns are named by the stage's first word (raw, cleaned, deduped,
    tokenized) so the table fits the page; a batch that does not conserve records is named under token_counts."""
    stages = {s.stage: s.stage.split("_")[0] for s in funnel.stages}
    labels = list(stages.values())
    rows = []
    for batch in funnel.batches:
        out = {stages[s.stage]: s.docs_out for s in batch.stages}
        counts = {
            "input": batch.stages[0].docs_in if batch.stages else 0,
            **{label: out.get(label, 0) for label in labels},
            "tokens": batch.tokens,
        }
        rows.append({"batch": batch.batch, **{k: f"{n:,}" for k, n in counts.items()}})
    return table(rows, ["batch", "input", *labels, "tokens"])


RAW_FILE_ROWS = 50  # per-file rows in the raw_records UI table; _stats.json lists every file
RAW_PREVIEW_RECORDS = 5
RAW_PREVIEW_CHARS = 120


def _raw_files_table(files: list[dict]) -> Table:
    cols = ["path", "records", "rejected", "bytes"]
    rest = files[RAW_FILE_ROWS:]
    more = [{"path": f"... and {len(rest)} more files", **{c: sum(f[c] for f in rest) for c in cols[1:]}}]
    return table(files[:RAW_FILE_ROWS] + (more if rest else []), cols)


def _raw_preview_table(folder: Path) -> Table:
    """The first records of the first shard: id, source path:locator and meta (wrappable: it is cut anyway) in one
    column, the text in the other (two columns fit a 1600 px window)."""
    rows = []
    for shard in record_shards(folder)[:1]:
        for rec in itertools.islice(iter_jsonl(shard), RAW_PREVIEW_RECORDS):
            src = rec["source"]
            rows.append(
                {
                    "record": cell(f"{rec['id']} {src['path']}:{src.get('line', src.get('index'))}", RAW_PREVIEW_CHARS)
                    + " "
                    + wrappable(cell(json.dumps(rec["meta"], ensure_ascii=False), RAW_PREVIEW_CHARS), 20),
                    "text": cell(rec["text"], RAW_PREVIEW_CHARS),
                }
            )
    return table(rows, ["record", "text"])


def raw_records_metadata(result: RawResult, path: Path) -> dict:
    """raw_records: the counts, rejections by reason, a per-file table and a preview of the first records."""
    return {
        **stage_counts(result, path),
        **disk_metadata(path),
        "rejected_by_reason": dg.MetadataValue.json(result.rejected_by_reason),
        "rejected_samples": drop_samples_table(result.rejected_samples, "snippet"),
        # WARC records that are not documents (request, metadata, non-HTML response, ...): outside docs_in
        "skipped_records": result.skipped_records,
        "skipped_records_by_reason": dg.MetadataValue.json(result.skipped_records_by_reason),
        # web inputs: which extractor read the pages, and what their main text is mostly made of
        "html_extractor": result.settings["extractor"],
        "html_pages_by_shape": dg.MetadataValue.json(result.pages_by_shape),
        "files_read": result.files_read,
        "skipped_files": len(result.skipped_files),
        "files": dagster_table(_raw_files_table(result.files)),
        "bytes_read": result.bytes_read,
        "remote_retries": result.remote_retries,  # an object-storage source: transient errors retried (run fact)
        "shards": result.shards,
        "preview": markdown_table(_raw_preview_table(path)),
    }


CLEAN_TOP_LINES = 15  # boilerplate lines shown in the cleaned_jsonl UI table; _stats.json keeps 50 with scores
BOILERPLATE_LINE_CHARS = 60  # the table has four columns: a longer line pushes the last ones out of the page


def cleaned_jsonl_metadata(result: CleanResult, path: Path) -> dict:
    """cleaned_jsonl: the counts, repairs, the top boilerplate lines, before/after examples, length histogram."""
    bp = result.boilerplate
    top = table(
        [
            {
                "line": plain_cell(e["line"], BOILERPLATE_LINE_CHARS),
                "stripped": e["count"],
                "score": e["score"],
                "in docs": e["df"],
            }
            for e in bp["top_lines"][:CLEAN_TOP_LINES]
        ],
        ["line", "stripped", "score", "in docs"],
    )
    examples = table(
        [
            {"id": e["id"], "change": e["kind"], "before": plain_cell(e["before"]), "after": plain_cell(e["after"])}
            for e in result.examples
        ],
        ["id", "change", "before", "after"],
    )
    lengths = table(
        zip(result.length_buckets, result.length_hist_before, result.length_hist_after),
        ["characters", "records before", "records after"],
    )
    return {
        **stage_counts(result, path),
        **disk_metadata(path),
        "mojibake_repaired": result.mojibake_repaired,
        "docs_meta_extracted": result.docs_meta_extracted,
        "boilerplate_lines_stripped": bp["lines_stripped"],
        "boilerplate_docs_touched": bp["docs_touched"],
        "boilerplate_top_lines": dagster_table(top),
        "rejected_samples": _cleaned_drop_samples(result.rejected_samples),
        **dropped_by_language_table(result.dropped_by_language),
        "quality_profile": result.quality_profile["why"],
        "examples": dagster_table(examples),
        "length_distribution": markdown_table(lengths),
        **languages_table(_cleaned_languages(result), ["records", "share", "chars"]),
        **_pii_and_contamination(result),
        **_quality_model(result.quality_model),
        "chars_in": result.chars_in,
        "chars_out": result.chars_out,
    }


def _quality_model(report: dict | None) -> dict:
    """The quality-model step: its model and rule, the kept share and mean score (numbers, plotted across runs),
    the score histogram as bars, mean score per language and per source, and the lowest-scored kept and
    highest-scored dropped records."""
    if report is None:
        return {}
    hist = report["histogram"]
    edges, top = hist["edges"], max([*hist["kept"], *hist["dropped"], 1])
    bars = table(
        [
            (f"{lo:g}-{hi:g}", kept, dropped, text_bar(kept, top, HISTOGRAM_BAR) + "|" + text_bar(dropped, top, 10))
            for lo, hi, kept, dropped in zip(edges, edges[1:], hist["kept"], hist["dropped"])
            if kept or dropped
        ],
        ["score", "kept", "dropped", "kept | dropped"],
    )
    means = [
        {"group": f"{kind} {name}", "records": row["records"], "mean score": row["mean_score"]}
        for kind, rows in (("language", report["by_language"]), ("source", report["by_source"]))
        for name, row in rows.items()
    ]
    extremes = [
        {"kind": kind, "id": e["id"], "score": e["score"], "text": plain_cell(e["text"], SAMPLE_CELL_CHARS)}
        for kind, key in (("lowest kept", "lowest_kept"), ("highest dropped", "highest_dropped"))
        for e in report[key]
    ]
    model = report["model"]
    return {
        "quality_model": f"{model['kind']} {model['id']} ({model['path']}), rule: {report['rule']}",
        "quality_model_id": model["id"],
        "quality_kept_share": report["kept_share"],
        "quality_mean_score": report["mean_score"] if report["mean_score"] is not None else float("nan"),
        "quality_model_scored": report["model_scored"],
        "quality_reused_scores": report["reused_scores"],
        "quality_score_histogram": dagster_table(bars),
        "quality_mean_score_by_group": dagster_table(table(means, ["group", "records", "mean score"])),
        "quality_extremes": dagster_table(table(extremes, ["kind", "id", "score", "text"])),
    }


def _cleaned_drop_samples(samples: dict) -> dg.MetadataValue:
    """The first dropped records of each rule: the rule, the value it measured and its threshold in columns of
    their own (a rule without them, one of the curated filters, states both in its detail, shown as the value),
    and the text as the rule saw it."""
    rows = [
        {
            "rule": reason,
            "value": plain_cell(e["value"] if "value" in e else e.get("detail", ""), 60),
            "threshold": str(e.get("threshold", "")),
            "text": plain_cell(e.get("text"), SAMPLE_CELL_CHARS),
        }
        for reason, entries in sorted(samples.items())
        for e in entries[:SAMPLES_SHOWN]
    ]
    return dagster_table(table(rows, ["rule", "value", "threshold", "text"]))


def _cleaned_languages(result: CleanResult) -> list[dict]:
    """cleaned_jsonl's records and characters per language, most records first (as the result orders them)."""
    out = max(result.docs_out, 1)
    return [
        {"language": language, "records": f["records"], "share": round(f["records"] / out, 4), "chars": f["chars"]}
        for language, f in (result.languages or {}).items()
    ]


def _pii_and_contamination(result: CleanResult) -> dict:
    """Addresses masked per kind, and per evaluation file of decontaminate: its items, n-grams and records hit."""
    out = {"pii_masked": dg.MetadataValue.json(result.pii), "docs_pii_masked": result.docs_pii_masked}
    files = result.decontamination["files"]
    if files:
        cols = ["file", "items", "items_too_short", "ngrams", "hits", "cache"]
        out["decontamination"] = dagster_table(table(files, cols))
        out["contamination_mode"] = result.decontamination["mode"]
        out["flagged_contamination"] = result.flagged_contamination
    return out


DEDUP_SOURCE_ROWS = 20  # per-source rows shown in the UI; the full list is in report.json
DEDUP_TEXT_CHARS = 80  # characters of each text in the side-by-side samples


def _dedup_samples_md(samples: list[dict]) -> str:
    out = []
    for i, s in enumerate(samples):
        shown = f", {len(s['members'])} shown" if len(s["members"]) < s["size"] else ""
        members = table(
            [
                {
                    "role": m["role"],
                    "level": m["level"],
                    "similarity": f"{m['similarity']:.3f}",
                    "source": cell(m["source"]["path"], DEDUP_TEXT_CHARS)
                    + ":"
                    + str(m["source"].get("line", m["source"].get("index", ""))),
                    "text": cell(m["text"], DEDUP_TEXT_CHARS),
                }
                for m in s["members"]
            ],
            ["role", "level", "similarity", "source", "text"],
        )
        out.append(f"**cluster {i + 1}** ({s['size']} records{shown})\n\n{markdown_table(members).value}\n")
    return "\n".join(out) or "no duplicates"


def dedup_report_metadata(
    result: DedupResult, report: dict, folder: Path, clusters_file: str, report_file: str
) -> dict:
    """dedup_report: counts (a batch deduplicated against the index: removals cross- and within-batch, the index's
    size), parameters, per-source table, cluster-size histogram and sample clusters."""
    c, p = report["counts"], report["parameters"]
    params = [
        ("threshold", p["threshold"]),
        ("bands x rows", f"{p['bands']} x {p['rows']} of {p['num_perm']} permutations"),
        ("shingles", f"{p['ngram_rule']} (sketched: {p['shingle_sizes']})"),
        ("key", p["key"]),
        ("keep rule", p["keep"]),
        ("clusters", p["clusters"]),
        ("MinHash", p["minhash"]),
        ("oversized buckets", p["bucket_limit"]),
        (
            "signature pre-filter",
            f"at least {p['signature_filter']['min_agreement']} of {p['signature_filter']['of']} positions agree",
        ),
    ]
    params += [(f"P(candidate) at Jaccard {s}", v) for s, v in p["catch_probability"].items()]
    # three columns, so the table fits a 1600 px window beside its key
    sources = table(
        [
            {
                "path": r["path"],
                "records": f"{r['records_in']:,} in, {r['kept']:,} kept",
                "removed": f"{r['exact_removed']:,} exact, {r['near_removed']:,} near "
                f"({r['cross_file']:,} duplicating another file)",
            }
            for r in sorted(report["per_source"], key=lambda r: -(r["exact_removed"] + r["near_removed"]))[
                :DEDUP_SOURCE_ROWS
            ]
        ],
        ["path", "records", "removed"],
    )
    return {
        **stage_counts(result, folder / report_file),
        **disk_metadata(folder),
        **(result.incremental or {}),
        **{
            k: c[k]
            for k in (
                "candidate_pairs",
                "verified_pairs",
                "rejected_candidates",
                "signature_rejected",
                "clusters",
                "largest_cluster",
                "components",
                "components_with_several_kept",
                "second_look_pairs",
                "second_look_joins",
                "chained_removals",
                "cross_file_duplicates",
                "oversized_buckets",
                "pairs_not_emitted",
            )
        },
        # numbers, so the asset's Plots draw them across its materializations (quality.py: the estimate's interval)
        **{
            k: dg.MetadataValue.float(float(report.get("quality", {}).get(key, default)))
            for k, key, default in (
                ("recall_estimate", "recall", 1.0),
                ("recall_low", "recall_low", 0.0),
                ("recall_high", "recall_high", 1.0),
                ("direct_precision", "direct_precision", 1.0),
            )
        },
        "bands_x_rows": f"{p['bands']} x {p['rows']}",
        "parameters": markdown_table(
            table([(name, wrappable(value)) for name, value in params], ["parameter", "value"])
        ),
        "per_source": dagster_table(sources),
        "cluster_sizes": dagster_table(table(report["cluster_sizes"], ["size", "clusters", "records"])),
        "sample_clusters": dg.MetadataValue.md(_dedup_samples_md(report["samples"])),
        "clusters_path": dg.MetadataValue.path(str(folder / clusters_file)),
    }


REMOVED_SAMPLES_COLUMNS = ["cluster", "role", "id", "record", "level", "similarity", "keep reason", "text", "diff"]
DIFF_CELL_CHARS = 400  # characters of a removed record's word diff against the kept one


def removed_samples_table(clusters: list[dict]) -> Table:
    """Sample clusters of the dedup report, one row per record: the kept one (or the earlier batch's record it
    duplicates), then those removed as its duplicates, with id, file:line, level, similarity, the cluster's keep
    reason, the text and, for a removed record, where its words differ from the kept one's (a long text's change
    can sit past the cell's end). Every other record: `tokenmill explain ID`."""
    rows = []
    for i, c in enumerate(clusters):
        kept_text = c["members"][0].get("text")
        for m in c["members"]:
            removed = m["role"] == "removed"
            diff = ""
            if removed and kept_text is not None and m.get("text") is not None:
                diff = word_diff(kept_text, m["text"]) or "same words"
            rows.append(
                {
                    "cluster": i + 1,
                    "role": m["role"],
                    "id": m.get("id", ""),
                    "record": plain_cell(where(m["source"]), 60) if m.get("source") else "",
                    "level": m["level"],
                    "similarity": f"{m['similarity']:.3f}",
                    "keep reason": c.get("reason", "") if not removed else "",
                    "text": plain_cell(m["text"], SAMPLE_CELL_CHARS),
                    "diff": plain_cell(diff, DIFF_CELL_CHARS),
                }
            )
    return table(rows, REMOVED_SAMPLES_COLUMNS)


def removed_samples_page(samples: Table) -> Table:
    """`removed_samples_table` in two columns that fit a 1600 px window: the record (id, file:line, cluster and its
    part in it: kept with the keep reason, or removed with level and similarity) and its text, or for a removed
    record its word diff against the kept one (`tokenmill explain ID` prints both texts in full)."""
    rows = []
    for r in samples.records():
        removed = r["role"] == "removed"
        part = f"{r['level']} {r['similarity']}" if removed else r["keep reason"]
        rows.append(
            {
                "record": " ".join(
                    x for x in (r["id"], r["record"], f"cluster {r['cluster']}", r["role"] + (":" if part else "")) if x
                )
                + (f" {part}" if part else ""),
                "text (removed: diff from kept)": r["diff"] if removed and r["diff"] else r["text"],
            }
        )
    return table(rows, ["record", "text (removed: diff from kept)"])


def deduped_jsonl_metadata(result: DedupApplyResult, folder: Path, removed_file: str) -> dict:
    """deduped_jsonl: the counts, removed records next to the one kept, and where every removed record is listed."""
    return {
        **stage_counts(result, folder),
        **disk_metadata(folder),
        "removed_samples": dagster_table(removed_samples_page(removed_samples_table(result.removed_samples))),
        "removed_path": dg.MetadataValue.path(str(folder / removed_file)),
    }


TOKENIZER_EXAMPLE_PIECES = 16  # tokens shown per example text in the tokenizer UI table
HISTOGRAM_BAR = 30  # characters of the longest bar in the tokens-per-document histogram


def tokenizer_metadata(result: TokenizerResult, folder: Path) -> dict:
    """tokenizer: vocabulary, sample, held-out chars per token and a few texts split into tokens."""
    examples = table(
        [
            {
                "text": plain_cell(e["text"], 40),
                "tokens": e["tokens"],
                "first tokens": plain_cell(
                    " · ".join(p.translate(PIECE_MARKS) for p in e["pieces"][:TOKENIZER_EXAMPLE_PIECES])
                ),
            }
            for e in result.examples
        ],
        ["text", "tokens", "first tokens"],
    )
    return {
        **stage_counts(result, folder / "tokenizer.json"),
        **disk_metadata(folder),
        "mode": result.mode,
        "vocab_size": result.vocab_size,
        "sample_records": result.sample_records,
        "sample_chars": result.sample_chars,
        "chars_per_token_held_out": result.chars_per_token or 0.0,
        "examples": dagster_table(examples),
        "special_tokens": dg.MetadataValue.json(result.special_tokens),
        # in groups of 16 hex digits: 64 in one piece would push the page's values off the window
        "tokenizer_sha256": " ".join(textwrap.wrap(result.tokenizer_sha256, 16)),
        "train_seconds": result.train_seconds,
    }


def tokenized_bins_metadata(result: TokenizeResult, folder: Path) -> dict:
    """tokenized_bins: tokens (supervised/masked), splits, tokens per document, bytes per file, a decoded sample."""
    tpd = result.tokens_per_doc
    top = max((row["docs"] for row in tpd["histogram"]), default=1) or 1
    hist = table(
        [(row["tokens"], f"{row['docs']:,}", text_bar(row["docs"], top, HISTOGRAM_BAR)) for row in tpd["histogram"]],
        ["tokens/doc", "docs", ""],
    )
    sizes = table(sorted(result.bytes_on_disk.items()), ["file", "bytes"])
    sample = (
        # escaped: the Markdown view would take special tokens such as </s> for HTML tags and hide them
        ("Masked tokens in [~~brackets~~]:\n\n" + html.escape(result.sample["markdown"], quote=False))
        if result.sample is not None
        else "no records"
    )
    return {
        **stage_counts(result, folder),
        "training_type": result.training_type,
        "training_type_setting": result.training_type_setting,
        "training_type_reason": result.training_type_reason,
        **({"val_warning": result.val_warning} if result.val_warning else {}),
        **({"val_moved": ", ".join(result.val_moved)} if result.val_moved else {}),
        "rejected_samples": drop_samples_table(result.rejected_samples),
        "tokens": dg.MetadataValue.int(result.tokens),
        "supervised_tokens": result.supervised_tokens,
        "masked_tokens": result.masked_tokens,
        "supervised_share": result.supervised_share,
        "masked_share": result.masked_share,
        "records": result.records,
        "metadata_dropout": result.metadata_dropout,
        "metadata_dropout_share": result.metadata_dropout_share,
        "train_tokens": result.train_tokens,
        "val_tokens": result.val_tokens,
        "train_records": result.train_records,
        "val_records": result.val_records,
        "isolated_punctuation_share": result.isolated_punctuation_share,
        "token_dtype": result.token_dtype,
        "vocab_size": result.vocab_size,
        "tokens_per_second": result.tokens_per_second,
        "chars_per_token": result.chars_per_token or 0.0,
        "tokens_per_doc_mean": tpd["mean"],
        "tokens_per_doc_p99": tpd["p99"],
        "tokens_per_doc": markdown_table(hist),
        "bytes_on_disk": dagster_table(sizes),
        **disk_metadata(folder),
        "sample": dg.MetadataValue.md(sample),
    }


def compute_metadata(usage) -> dict:
    """Where the asset's steps ran (a tokenmill.common.compute.Usage): engine, nodes, CPUs, seconds per step."""
    return {
        "engine": usage.engine,
        "nodes": usage.nodes,
        "cpus": float(usage.cpus),
        "step_seconds": dg.MetadataValue.json(usage.steps),
    }
