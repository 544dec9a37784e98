"""dedup_report and deduped_jsonl: two-level deduplication, exact (SHA-256 of a normalized key) and near (MinHash +
LSH + exact Jaccard), following datatrove's MinHash steps. One module per step, each a plain function over a small
task dataclass that reads and writes files in the stage folder (layout.py), so any step can run as tasks in
another process or machine:

  keys         the dedup key and its SHA-256; exact groups, one task per digest range
  signatures   per input chunk: document table, keys, MinHash signatures, band hashes
  buckets      LSH band buckets -> candidate pairs, one task per band and band-hash range
  verify       signature pre-filter, then exact Jaccard of the candidates -> verified pairs, one task per range
               of first documents
  clusters     union-find over the pairs, keep rule -> clusters.jsonl and the decisions per chunk
  report       report.json: parameters, counts, per-source counts, histogram, sample clusters
  apply        write_deduped: survivors and removed.jsonl, one task per chunk
  index        the dedup index: one segment per batch (what later batches are deduplicated against)
  stage        build_dedup_report: the steps in order; dedup_batch: the same over a batch after the index
"""

from tokenmill.stages.dedup.apply import DedupApplyResult, write_deduped
from tokenmill.stages.dedup.layout import CLUSTERS_FILE, DECISION_DIR, REPORT_FILE
from tokenmill.stages.dedup.report import DedupResult
from tokenmill.stages.dedup.settings import DedupSettings
from tokenmill.stages.dedup.stage import Partitions, build_dedup_report, dedup_batch

# code_version of dedup_report, dedup_index and deduped_jsonl (Dagster shows what an older one built as stale):
# the date of the last change to the output's bytes; bump it with such a change, not with a refactor that keeps
# them byte-identical.
VERSION = "2026-12-07.1"  # hubs in oversized buckets (bucket_hubs 2): more near duplicates found on web text

__all__ = [
    "CLUSTERS_FILE",
    "DECISION_DIR",
    "REPORT_FILE",
    "VERSION",
    "DedupApplyResult",
    "DedupResult",
    "DedupSettings",
    "Partitions",
    "build_dedup_report",
    "dedup_batch",
    "write_deduped",
]
