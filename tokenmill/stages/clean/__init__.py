"""cleaned_jsonl: repair, normalize, extract metadata, strip boilerplate and filter garbage, shard by shard.

Rules, in the order they run on each record (each a plain function, one module per kind):

  0. too_long guard       reject texts over `max_chars` before any work (reason "too_long")       filters
                          (`filters.TOO_LONG`)
  1. repair_surrogates    lone UTF-16 surrogates (JSON "\\ud800") removed, counted                repair
  2. repair_mojibake      ftfy, encodings and HTML entities only (no width/quote/line-break changes)
  3. normalize_unicode    NFC (default), NFKC or none
  4. strip_control_chars  control, zero-width, BOM and bidi characters removed
  5. normalize_whitespace \\r\\n -> \\n, exotic spaces, trailing spaces, blank-line runs, outer blank lines, runs
                          of spaces inside a line (kept in code-like texts, or with collapse_inner_spaces off)
  5b. mask_pii            e-mail and IP addresses (phone numbers when asked) -> placeholders, counted     pii
                          per kind; also in chat fields, rejected samples and examples (never the input's)
  6. extract_metadata     Title:/Author:/作者：/朝代：/By ... header lines (and repeats of the reader's    metadata
                          title or author) moved from the top of the text into `meta`, before boilerplate removal
  7. strip_boilerplate    lines whose joint boilerplate score passes the threshold    line_stats, boilerplate
  8. record filters       `filters.RECORD_FILTERS`, in order; the first failing one names the reason    filters
                          (each declared once there: reasons, timing names and `dropped_<reason>` derive from it)
  8a. identify_language   meta.language and meta.language_score of each record the filters kept    language
                          (CLD2, py3langid where CLD2 is unsure); `languages` / `min_language_score` reject
                          ("language"); in pass 1 and again in pass 2 for a record whose lines were stripped
  8b. decontaminate       a record sharing an n-gram with an item of a `decontaminate` evaluation    decontam
                          file is dropped ("contamination", the file and item named) or flagged in meta; pass 1,
                          every record with text (a dropped one leaves the line statistics: pass 2 keeps it out)

Rules 1-5 only run on a text that a few C-speed string tests (`needs_repair`) flag; most clean text skips them.

Steps, each over every shard in parallel (`map_ordered`, one task per input shard, results in shard order):
  prepare  pass 1: reads and parses each record once, rules 0-6, then rule 8 on the text as it stands, and
           gathers line statistics (`line_stats.LineTable`, written to a file per shard: `save_lines`); stages
           per batch (`staging.StagedBatch`) each record's output line, its rejected line if a filter failed,
           and the hashes of its lines
  merge    one task per hash range of the line hashes (`boilerplate.merge_task`, ~`MERGE_ROWS` rows of every
           shard's file each, memory-mapped): `merge_line_stats` keeps lines in >= `bp_min_df` documents,
           `prune_candidates` drops, vectorized, those that cannot reach the threshold; the ranges' candidates
           in order are the corpus's
  finish   pass 2: finds, with one np.isin per batch, the records that hold a candidate line, strips their
           boilerplate lines (rule 7) and runs rule 8 again on them only, then writes `part-XXXXX.jsonl` (same
           shard names as the input) and a rejected side file per shard, concatenated in order into
           `_rejected.jsonl`
  corpus   the orchestration of the three and the stats (`report`: seconds per rule, lengths, examples)
Output is byte-identical for any worker count; records in = out + dropped, `dropped` holding every declared
reason and any other a rule returned (checked before `_stats.json`).
"""

from tokenmill.stages.clean.corpus import REASONS, CleanResult, clean_corpus
from tokenmill.stages.clean.settings import CleanSettings

# code_version of cleaned_jsonl (Dagster shows what an older one built as stale): the date of the last
# change to the output's bytes; bump it with such a change, not with a refactor that keeps them byte-identical.
VERSION = "2026-12-07"  # IPv4 masking keeps version strings, masks zero-padded addresses

__all__ = ["REASONS", "VERSION", "CleanResult", "CleanSettings", "clean_corpus"]
