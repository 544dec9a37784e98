"""dedup_report and deduped_jsonl: two-level deduplication (exact key hash, then MinHash + LSH + exact Jaccard)."""

import dagster as dg
from pydantic import Field

from resources import DataRoot
from tokenmill.dedup import CLUSTERS_FILE, REPORT_FILE, DedupSettings, build_dedup_report, write_deduped
from tokenmill.common.io import REMOVED_FILE, read_json, staged_output

MAX_TABLE_ROWS = 20  # per-source rows shown in the UI; the full list is in report.json
TEXT_CHARS = 80  # characters of each text in the side-by-side samples


class DedupConfig(dg.Config):
    threshold: float = Field(default=DedupSettings.threshold, description="Jaccard of shingle sets at or above which two records are near duplicates")
    num_perm: int = Field(default=DedupSettings.num_perm, description="MinHash permutations")
    seed: int = Field(default=DedupSettings.seed, description="MinHash seed (datasketch-compatible)")
    ngram: int = Field(default=DedupSettings.ngram, description="Shingle size in characters; 0 = by key length (2 / 3 / 5)")
    ngram_bounds: list[int] = Field(default=list(DedupSettings.ngram_bounds), description="Key-length bounds of the automatic shingle size")
    bands: int = Field(default=DedupSettings.bands, description="LSH bands; 0 = chosen for the threshold")
    rows: int = Field(default=DedupSettings.rows, description="LSH rows per band; 0 = chosen with bands")
    fn_weight: float = Field(default=DedupSettings.fn_weight, description="Weight of missed pairs vs false candidates when choosing bands x rows")
    shingle_hash: str = Field(default=DedupSettings.shingle_hash, description="'poly' (fast) or 'sha1' (datasketch's default hash)")
    strip_symbols: bool = Field(default=DedupSettings.strip_symbols, description="Remove Unicode symbols from the dedup key")
    fold_chinese: bool = Field(default=DedupSettings.fold_chinese, description="Fold traditional to simplified Chinese in the key (needs opencc)")
    keep: str = Field(default=DedupSettings.keep, description="Survivor of a cluster: richest_meta, first or longest")
    max_bucket: int = Field(default=DedupSettings.max_bucket, description="LSH buckets above this size emit 2m pairs (counted)")
    chunk_bytes: int = Field(default=DedupSettings.chunk_bytes, description="Bytes of input per parallel task")
    sample_clusters: int = Field(default=DedupSettings.sample_clusters, description="Sample clusters with texts in the report")


def _cell(text) -> str:
    text = str(text or "").replace("\n", " / ").replace("|", "\\|")
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS] + "…"


def _samples_md(samples: list[dict]) -> str:
    out = []
    for i, s in enumerate(samples):
        shown = f", {len(s['members'])} shown" if len(s["members"]) < s["size"] else ""
        out.append(f"**cluster {i + 1}** ({s['size']} records{shown})\n\n| role | level | similarity | source | text |\n|---|---|---|---|---|")
        for m in s["members"]:
            src = m["source"]
            loc = src.get("line", src.get("index", ""))
            out.append(f"| {m['role']} | {m['level']} | {m['similarity']:.3f} | {_cell(src['path'])}:{loc} | {_cell(m['text'])} |")
        out.append("")
    return "\n".join(out) or "no duplicates"


def _params_md(p: dict) -> str:
    rows = [f"| threshold | {p['threshold']} |", f"| bands x rows | {p['bands']} x {p['rows']} of {p['num_perm']} permutations |",
            f"| shingles | {p['ngram_rule']} (sketched: {p['shingle_sizes']}) |", f"| key | {p['key']} |",
            f"| keep rule | {p['keep']} |", f"| MinHash | {p['minhash']} |"]
    rows += [f"| P(candidate) at Jaccard {s} | {v} |" for s, v in p["catch_probability"].items()]
    return "| parameter | value |\n|---|---|\n" + "\n".join(rows)


@dg.asset(group_name="dedup", kinds={"python", "numpy"}, deps=["cleaned_jsonl"], code_version="1")
def dedup_report(context: dg.AssetExecutionContext, config: DedupConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """Which cleaned records are duplicates, and of which record: exact (SHA-256 of a normalized key) and near
    (character shingles, MinHash, LSH bands chosen for the threshold, every candidate verified by exact Jaccard),
    clustered by union-find; one record per cluster is kept by a documented rule. `report.json` and
    `clusters.jsonl` hold the full report; `deduped_jsonl` applies it."""
    settings = DedupSettings(**config.model_dump())
    with staged_output(data_root.path("dedup_report")) as out:
        stats = build_dedup_report(data_root.path("cleaned_jsonl"), out, settings, log=context.log)
        report = read_json(out / REPORT_FILE)
    final = data_root.path("dedup_report")
    c, p = report["counts"], report["parameters"]
    per_source = sorted(report["per_source"], key=lambda r: -(r["exact_removed"] + r["near_removed"]))[:MAX_TABLE_ROWS]
    source_cols = ["path", "records_in", "kept", "exact_removed", "near_removed", "cross_file"]
    return dg.MaterializeResult(metadata={
        "docs_in": stats["docs_in"], "docs_out": stats["docs_out"],
        "dropped_exact_duplicate": stats["dropped_exact_duplicate"], "dropped_near_duplicate": stats["dropped_near_duplicate"],
        **{k: c[k] for k in ("candidate_pairs", "verified_pairs", "rejected_candidates", "clusters", "largest_cluster",
                             "components", "components_with_several_kept", "cross_file_duplicates", "oversized_buckets",
                             "pairs_not_emitted")},
        "bands_x_rows": f"{p['bands']} x {p['rows']}",
        "parameters": dg.MetadataValue.md(_params_md(p)),
        "per_source": dg.MetadataValue.table(
            records=[dg.TableRecord({k: r[k] for k in source_cols}) for r in per_source],
            schema=dg.TableSchema(columns=[dg.TableColumn(k, "string" if k == "path" else "int") for k in source_cols])),
        "cluster_sizes": dg.MetadataValue.table(
            records=[dg.TableRecord(r) for r in report["cluster_sizes"]],
            schema=dg.TableSchema(columns=[dg.TableColumn("size", "string"), dg.TableColumn("clusters", "int"),
                                           dg.TableColumn("records", "int")])),
        "sample_clusters": dg.MetadataValue.md(_samples_md(report["samples"])),
        "seconds": stats["seconds"],
        "path": dg.MetadataValue.path(str(final / REPORT_FILE)),
        "clusters_path": dg.MetadataValue.path(str(final / CLUSTERS_FILE)),
    })


@dg.asset(group_name="dedup", kinds={"python", "jsonl"}, deps=["dedup_report", "cleaned_jsonl"], code_version="1")
def deduped_jsonl(context: dg.AssetExecutionContext, data_root: DataRoot) -> dg.MaterializeResult:
    """The cleaned records minus the duplicates `dedup_report` found (lines copied unchanged, same shard names);
    `removed.jsonl` names, for every removed id, the id it duplicates, the level and the similarity."""
    with staged_output(data_root.path("deduped_jsonl")) as out:
        stats = write_deduped(data_root.path("cleaned_jsonl"), data_root.path("dedup_report"), out, log=context.log)
    final = data_root.path("deduped_jsonl")
    return dg.MaterializeResult(metadata={
        **{k: stats[k] for k in ("docs_in", "docs_out", "dropped_exact_duplicate", "dropped_near_duplicate", "seconds")},
        "path": dg.MetadataValue.path(str(final)),
        "removed_path": dg.MetadataValue.path(str(final / REMOVED_FILE)),
    })
