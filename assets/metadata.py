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

from tokenmill.batches import REGISTRY_FILE, read_registry
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
    columns = [
        dg.TableColumn(
            str(c),
            "int"
            if pd.api.types.is_integer_dtype(frame[c])
            else "float"
            if pd.api.types.is_float_dtype(frame[c])
            else "string",
        )
        for c in frame.columns
    ]
    records = [
        dg.TableRecord({str(k): (v.item() if hasattr(v, "item") else v) for k, v in row.items()})
        for row in frame.to_dict(orient="records")
    ]
    return dg.MetadataValue.table(records=records, schema=dg.TableSchema(columns=columns))


def source_metadata(path: Path) -> dict:
    """Which corpus an output was built from (the source path and generation of the data root's batch registry),
    so the UI tells corpora apart when one instance has seen several."""
    for root in Path(path).parents:
        if (root / REGISTRY_FILE).exists():
            registry = read_registry(root)
            return {
                "source": dg.MetadataValue.path(registry.source),
                "source_generation": dg.MetadataValue.int(registry.generation),
                "source_batches": dg.MetadataValue.int(len(registry.batches)),
            }
    return {}


def stage_counts(stats: dict, path: Path) -> dict:
    """The keys every stage shows: docs_in, docs_out, dropped_<reason>, seconds, path, and the source it came from."""
    return {
        **source_metadata(path),
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
        + [
            (
                s["label"],
                f"{s['docs_out']:,}",
                f"{100 * s['docs_out'] / raw:.2f}%",
                ", ".join(f"{k}: {v:,}" for k, v in s["dropped"].items() if v) or "-",
            )
            for s in funnel["stages"]
        ],
        columns=["stage", "records", "share of raw", "dropped"],
    )
    t = funnel["tokens"]
    tokens = [
        ("total", f"{t['total']:,}", "100.00%"),
        ("supervised", f"{t['supervised']:,}", f"{100 * t['supervised_share']:.2f}%"),
        ("masked (-100)", f"{t['masked']:,}", f"{100 * t['masked_share']:.2f}%"),
    ]
    if t.get("isolated_punctuation_share") is not None:
        tokens.append(("isolated punctuation", "", f"{100 * t['isolated_punctuation_share']:.2f}%"))
    tokens += [
        (f"{name} split", f"{split.get('tokens', 0):,} tokens", f"{split.get('records', 0):,} records")
        for name, split in funnel["split"].items()
        if split
    ]
    conservation = (
        "Every stage conserves records (in = out + dropped)."
        if funnel["conserved"]
        else "**A stage does not conserve records: see funnel.json.**"
    )
    funnel_md = "\n\n".join(
        [
            markdown_table(stages).value,
            markdown_table(pd.DataFrame(tokens, columns=["tokens", "count", "share"])).value,
            conservation,
        ]
    )
    return {
        **source_metadata(folder),
        "funnel": dg.MetadataValue.md(funnel_md),
        "batches": dagster_table(batches_frame(funnel)),
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


def batches_frame(funnel: dict) -> pd.DataFrame:
    """One row per source batch: records after each stage, tokens, and whether the batch conserves records."""
    labels = [s["stage"] for s in funnel["stages"]]
    rows = []
    for batch in funnel["batches"]:
        out = {s["stage"]: s["docs_out"] for s in batch["stages"]}
        rows.append(
            {
                "batch": batch["batch"],
                "input": batch["stages"][0]["docs_in"] if batch["stages"] else 0,
                **{label: out.get(label, 0) for label in labels},
                "tokens": batch["tokens"],
                "conserved": str(all(s["conserved"] and s["linked"] for s in batch["stages"])),
            }
        )
    return pd.DataFrame(rows, columns=["batch", "input", *labels, "tokens", "conserved"])


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
            rows.append(
                {
                    "id": rec["id"],
                    "source": cell(f"{src['path']}:{src.get('line', src.get('index'))}", RAW_PREVIEW_CHARS),
                    "meta": cell(json.dumps(rec["meta"], ensure_ascii=False), RAW_PREVIEW_CHARS),
                    "text": cell(rec["text"], RAW_PREVIEW_CHARS),
                }
            )
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
        "preview": markdown_table(_raw_preview_frame(path)),
    }


CLEAN_TOP_LINES = 15  # boilerplate lines shown in the cleaned_jsonl UI table; _stats.json keeps 50


def cleaned_jsonl_metadata(stats: dict, path: Path) -> dict:
    """cleaned_jsonl: the counts, repairs, the top boilerplate lines, before/after examples, length histogram."""
    bp = stats["boilerplate"]
    top = pd.DataFrame(
        bp["top_lines"][:CLEAN_TOP_LINES], columns=["line", "count", "score", "df", "position", "template", "short"]
    )
    top["line"] = top["line"].map(cell)
    examples = pd.DataFrame(
        [
            {"id": e["id"], "change": e["kind"], "before": cell(e["before"]), "after": cell(e["after"])}
            for e in stats["examples"]
        ],
        columns=["id", "change", "before", "after"],
    )
    lengths = pd.DataFrame(
        {
            "characters": stats["length_buckets"],
            "records before": stats["length_hist_before"],
            "records after": stats["length_hist_after"],
        }
    )
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


DEDUP_SOURCE_ROWS = 20  # per-source rows shown in the UI; the full list is in report.json
DEDUP_TEXT_CHARS = 80  # characters of each text in the side-by-side samples


def _dedup_samples_md(samples: list[dict]) -> str:
    out = []
    for i, s in enumerate(samples):
        shown = f", {len(s['members'])} shown" if len(s["members"]) < s["size"] else ""
        members = pd.DataFrame(
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
            ]
        )
        out.append(f"**cluster {i + 1}** ({s['size']} records{shown})\n\n{markdown_table(members).value}\n")
    return "\n".join(out) or "no duplicates"


def dedup_report_metadata(stats: dict, report: dict, folder: Path, clusters_file: str, report_file: str) -> dict:
    """dedup_report: counts, parameters, per-source table, cluster-size histogram and sample clusters."""
    c, p = report["counts"], report["parameters"]
    params = [
        ("threshold", p["threshold"]),
        ("bands x rows", f"{p['bands']} x {p['rows']} of {p['num_perm']} permutations"),
        ("shingles", f"{p['ngram_rule']} (sketched: {p['shingle_sizes']})"),
        ("key", p["key"]),
        ("keep rule", p["keep"]),
        ("MinHash", p["minhash"]),
        ("oversized buckets", p["bucket_limit"]),
        (
            "signature pre-filter",
            f"at least {p['signature_filter']['min_agreement']} of {p['signature_filter']['of']} positions agree",
        ),
    ]
    params += [(f"P(candidate) at Jaccard {s}", v) for s, v in p["catch_probability"].items()]
    sources = pd.DataFrame(
        sorted(report["per_source"], key=lambda r: -(r["exact_removed"] + r["near_removed"]))[:DEDUP_SOURCE_ROWS],
        columns=["path", "records_in", "kept", "exact_removed", "near_removed", "cross_file"],
    )
    return {
        **stage_counts(stats, folder / report_file),
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
                "cross_file_duplicates",
                "oversized_buckets",
                "pairs_not_emitted",
            )
        },
        "bands_x_rows": f"{p['bands']} x {p['rows']}",
        "parameters": markdown_table(pd.DataFrame(params, columns=["parameter", "value"])),
        "per_source": dagster_table(sources),
        "cluster_sizes": dagster_table(pd.DataFrame(report["cluster_sizes"], columns=["size", "clusters", "records"])),
        "sample_clusters": dg.MetadataValue.md(_dedup_samples_md(report["samples"])),
        "clusters_path": dg.MetadataValue.path(str(folder / clusters_file)),
    }


def deduped_jsonl_metadata(stats: dict, folder: Path, removed_file: str) -> dict:
    """deduped_jsonl: the counts, and where the removed records are listed."""
    return {**stage_counts(stats, folder), "removed_path": dg.MetadataValue.path(str(folder / removed_file))}


TOKENIZER_EXAMPLE_PIECES = 16  # tokens shown per example text in the tokenizer UI table
HISTOGRAM_BAR = 30  # characters of the longest bar in the tokens-per-document histogram


def tokenizer_metadata(stats: dict, folder: Path) -> dict:
    """tokenizer: vocabulary, sample, held-out chars per token and a few texts split into tokens."""
    examples = pd.DataFrame(
        [
            {
                "text": cell(e["text"], 40),
                "tokens": e["tokens"],
                "first tokens": cell(" · ".join(e["pieces"][:TOKENIZER_EXAMPLE_PIECES])),
            }
            for e in stats["examples"]
        ],
        columns=["text", "tokens", "first tokens"],
    )
    return {
        **stage_counts(stats, folder / "tokenizer.json"),
        "mode": stats["mode"],
        "vocab_size": stats["vocab_size"],
        "sample_records": stats["sample_records"],
        "sample_chars": stats["sample_chars"],
        "chars_per_token_held_out": stats["chars_per_token"] or 0.0,
        "examples": markdown_table(examples),
        "special_tokens": dg.MetadataValue.json(stats["special_tokens"]),
        "tokenizer_sha256": stats["tokenizer_sha256"],
        "train_seconds": stats["train_seconds"],
    }


def tokenized_bins_metadata(stats: dict, folder: Path) -> dict:
    """tokenized_bins: tokens (supervised/masked), splits, tokens per document, bytes per file, a decoded sample."""
    tpd = stats["tokens_per_doc"]
    hist = pd.DataFrame(tpd["histogram"], columns=["tokens", "docs"])
    top = max(int(hist["docs"].max()) if len(hist) else 0, 1)
    hist["bar"] = hist["docs"].map(lambda n: "█" * round(HISTOGRAM_BAR * n / top))
    hist["docs"] = hist["docs"].map("{:,}".format)
    sizes = pd.DataFrame(sorted(stats["bytes_on_disk"].items()), columns=["file", "bytes"])
    sample = (
        ("Masked tokens in [~~brackets~~]:\n\n" + stats["sample"]["markdown"]) if "sample" in stats else "no records"
    )
    return {
        **stage_counts(stats, folder),
        "training_type": stats["training_type"],
        "tokens": dg.MetadataValue.int(stats["tokens"]),
        **{
            k: stats[k]
            for k in (
                "supervised_tokens",
                "masked_tokens",
                "supervised_share",
                "masked_share",
                "records",
                "metadata_dropout",
                "metadata_dropout_share",
                "train_tokens",
                "val_tokens",
                "train_records",
                "val_records",
                "isolated_punctuation_share",
                "token_dtype",
                "vocab_size",
                "tokens_per_second",
            )
        },
        "chars_per_token": stats["chars_per_token"] or 0.0,
        "tokens_per_doc_mean": tpd["mean"],
        "tokens_per_doc_p99": tpd["p99"],
        "tokens_per_doc": markdown_table(hist.rename(columns={"tokens": "tokens/doc", "bar": ""})),
        "bytes_on_disk": dagster_table(sizes),
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
