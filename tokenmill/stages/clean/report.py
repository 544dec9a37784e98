"""What the cleaning stage reports besides counts: seconds per rule, length histograms, before/after examples."""

from __future__ import annotations

import json
import time
import unicodedata

import numpy as np

from tokenmill.stages.clean import filters
from tokenmill.stages.clean.repair import SURROGATE_RE

# the timing names around rule 8's, in _timings.json's order (rule 8's come from filters.RECORD_FILTERS)
RULES_BEFORE_FILTERS = (
    "read_json",
    filters.TOO_LONG.timer,
    "repair_surrogates",
    "repair_mojibake",
    "normalize_unicode",
    "strip_control_chars",
    "normalize_whitespace",
    "mask_pii",
    "extract_metadata",
    "assemble_records",
    "line_stats",
    "stage_io",
    "merge_line_stats",
    "strip_boilerplate",
)
RULES_AFTER_FILTERS = ("web_quality", "identify_language", "decontaminate", "write_json")


def rule_names() -> tuple[str, ...]:
    """Every timing name, in order: the ones around rule 8 and the record filters' (read when called)."""
    return (*RULES_BEFORE_FILTERS, *filters.filter_timers(), *RULES_AFTER_FILTERS)


RULES = rule_names()  # as declared at import; the stage calls rule_names()
# length histogram buckets (characters): [0,10), [10,20), ... [10000, inf)
LENGTH_BUCKETS = (0, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
EXAMPLE_CHARS = 160
EXAMPLE_KINDS = ("boilerplate", "metadata", "repair")


class Timer:
    """Seconds per rule, summed over a worker's batches (reported as each rule's share of the stage)."""

    def __init__(self):
        self.sec = dict.fromkeys(rule_names(), 0.0)
        self._t = time.perf_counter()

    def lap(self, rule: str) -> None:
        now = time.perf_counter()
        self.sec[rule] += now - self._t
        self._t = now


def length_hist(lengths: list[int]) -> list[int]:
    """Records per LENGTH_BUCKETS bucket."""
    if not lengths:
        return [0] * len(LENGTH_BUCKETS)
    idx = np.searchsorted(np.array(LENGTH_BUCKETS[1:]), np.array(lengths), side="right")
    return np.bincount(idx, minlength=len(LENGTH_BUCKETS)).tolist()


def bucket_labels() -> list[str]:
    edges = list(LENGTH_BUCKETS) + [None]
    return [f"{a}-{b - 1}" if b is not None else f"{a}+" for a, b in zip(edges, edges[1:])]


def _short(text: str) -> str:
    return text if len(text) <= EXAMPLE_CHARS else text[:EXAMPLE_CHARS] + "…"


def visible(text: str) -> str:
    """Text whose invisible characters show: controls, zero-width and bidi marks, combining marks (an NFC repair
    looks identical otherwise) written as <U+XXXX>; a lone surrogate of the input as U+FFFD (not valid JSON text).
    Newlines and tabs stay."""
    text = SURROGATE_RE.sub("\ufffd", text)
    return "".join(
        c if (c.isprintable() or c in "\n\t") and not unicodedata.combining(c) else f"<U+{ord(c):04X}>" for c in text
    )


def _diff_window(before: str, after: str) -> tuple[str, str]:
    """Short excerpts of before/after around their first difference (a repair deep in a long text shows)."""
    i = next((k for k, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    start = max(0, i - EXAMPLE_CHARS // 4)
    pre = "…" if start else ""
    window = EXAMPLE_CHARS + 1
    return pre + _short(visible(before[start : start + window])), pre + _short(visible(after[start : start + window]))


def _field_changes(old: dict, new: dict, mask=None) -> tuple[str, str]:
    """Before/after of the fields other than the text that changed (meta values, chat fields), one per line."""
    old_meta, new_meta = old.get("meta") or {}, new.get("meta") or {}
    fields = [(f"meta.{k}", old_meta.get(k), new_meta.get(k)) for k in dict.fromkeys([*old_meta, *new_meta])]
    fields += [(k, old.get(k), new.get(k)) for k in new if k not in ("id", "text", "meta", "source")]
    changed = [(name, a, b) for name, a, b in fields if a != b]

    def show(values) -> str:
        shown = "\n".join(f"{name}: {visible(json.dumps(v, ensure_ascii=False))}" for name, v in values)
        return _short(shown if mask is None else mask.mask(shown))

    return show((name, a) for name, a, _ in changed), show((name, b) for name, _, b in changed)


class Examples:
    """A few before/after examples per kind of change (boilerplate, metadata, repair). `mask` (a pii.PiiMasker)
    masks what an example shows of the input record: the output is masked already."""

    def __init__(self, n: int, mask=None):
        self.n, self.mask = n, mask
        self.by_kind: dict[str, list[dict]] = {}

    def add(self, kind: str, rec: dict, before: str, after: str, old: dict | None = None) -> None:
        """`rec` is the record as written, `old` the input record: when the text is unchanged, the example shows
        the other fields that changed."""
        shelf = self.by_kind.setdefault(kind, [])
        if len(shelf) < self.n:
            if self.mask is not None:
                before = self.mask.mask(before)
            if before != after or old is None:
                b, a = _diff_window(before, after)
            else:
                b, a = _field_changes(old, rec, self.mask)
            if b == a:  # nothing to show once masked (the change was the masking)
                return
            shelf.append(
                {
                    "id": rec.get("id"),
                    "kind": kind,
                    "before": b,
                    "after": a,
                    "meta": {k: _short(str(v)) for k, v in list((rec.get("meta") or {}).items())[:4]},
                }
            )


def pick_examples(by_kind: dict, n: int) -> list:
    """Up to n examples, taken in turn from each kind of change (boilerplate, metadata, repair)."""
    order = [k for k in EXAMPLE_KINDS if k in by_kind]
    out: list = []
    i = 0
    while len(out) < n and any(i < len(by_kind[k]) for k in order):
        out += [by_kind[k][i] for k in order if i < len(by_kind[k])]
        i += 1
    return out[:n]
