"""Bounded samples of dropped records, per reason: what a stage's metadata and rejected file show a user so a drop
can be read, not just counted. Memory stays flat: at most SAMPLES_PER_REASON entries per reason, texts cut."""

from __future__ import annotations

from collections.abc import Iterable

SAMPLES_PER_REASON = 10  # dropped records per reason and batch that keep their text
SAMPLE_CHARS = 300  # characters of a sampled text; `text_chars` gives the whole length


def cut_text(text: str, limit: int = SAMPLE_CHARS) -> str:
    """The start of a text, an ellipsis marking that it went on."""
    return text if len(text) <= limit else text[:limit] + "…"


def with_text(entry: dict, text: str) -> dict:
    """A drop entry with its record's text (cut; a lone surrogate of the input shown as '?') and its whole length."""
    shown = cut_text(text).encode("utf-8", errors="replace").decode("utf-8")
    return {**entry, "text": shown, "text_chars": len(text)}


class ReasonSamples:
    """The first `limit` entries of each reason, in the order they were offered."""

    def __init__(self, limit: int = SAMPLES_PER_REASON):
        self.limit = limit
        self.by_reason: dict[str, list] = {}

    def wants(self, reason: str) -> bool:
        return len(self.by_reason.get(reason, ())) < self.limit

    def add(self, reason: str, item) -> bool:
        """Keeps `item` when the reason has room; says whether it did."""
        if not self.wants(reason):
            return False
        self.by_reason.setdefault(reason, []).append(item)
        return True

    def merge(self, parts: Iterable[dict[str, list]]) -> ReasonSamples:
        """Adds the per-reason samples of several tasks, in task order (the result is the same for any worker
        count: each task kept its own first entries, and the first of the whole are among them)."""
        for part in parts:
            for reason, items in part.items():
                for item in items:
                    self.add(reason, item)
        return self

    def as_dict(self) -> dict[str, list]:
        return dict(sorted(self.by_reason.items()))
