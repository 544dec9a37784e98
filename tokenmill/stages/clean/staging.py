"""What pass 1 stages for pass 2, per batch of records: output lines as bytes, rejected lines, line hashes."""

from __future__ import annotations

import marshal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from tokenmill.common.io import dumps


@dataclass(kw_only=True)
class StagedBatch:
    out_lines: list[bytes]
    """Each record's output line (the input line itself when nothing changed)."""
    rej_lines: list[bytes | None]
    """Each record's rejected line, None when it passed the filters."""
    len_out: list[int]
    """Characters of each record's text as it stands."""
    n_lines: list[int]
    """How many line hashes each record has in `hashes` (0 when boilerplate detection is off)."""
    hashes: bytes
    """uint64 hashes of every record's non-blank lines, record after record."""
    languages: list[tuple | None]
    """Each record's (language, score), None when not identified (rejected before, or identification off)."""

    def dump(self, f: BinaryIO) -> None:
        marshal.dump((self.out_lines, self.rej_lines, self.len_out, self.n_lines, self.hashes, self.languages), f)

    @classmethod
    def load_all(cls, f: BinaryIO) -> Iterator[StagedBatch]:
        while True:
            try:
                out_lines, rej_lines, len_out, n_lines, hashes, languages = marshal.load(f)
            except EOFError:
                return
            yield cls(
                out_lines=out_lines,
                rej_lines=rej_lines,
                len_out=len_out,
                n_lines=n_lines,
                hashes=hashes,
                languages=languages,
            )


def rejected_line(rec: dict, reject: tuple, extra: str = "") -> bytes:
    """The _rejected.jsonl line of a record failing a filter: id, source, reason, detail, and the rule's evidence
    fields when it gives some (reject = (reason, detail) or (reason, detail, evidence))."""
    reason, detail, *evidence = reject
    entry = {"id": rec.get("id"), "source": rec.get("source"), "reason": reason, "detail": detail + extra}
    return dumps(entry | evidence[0] if evidence else entry).encode("utf-8")
