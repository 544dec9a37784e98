"""The record checks behind every record stage's asset check: they read outputs and report a figure and the
problems (the dedup and tokenize checks live in their stage packages: stages/dedup/checks.py,
stages/tokenize/checks.py).

The record checks first read the figures the stage wrote with its shards (SHARDS_FILE): when every shard is still
byte for byte the one the stage wrote (size and CRC-32) and the figures show the property (distinct ids; kept
records whose exact-key digests, from the dedup index, are distinct), nothing is parsed. Otherwise (no figures, a
shard changed or added since, or figures that do not show the property) every record is read again, and that audit
finds and names the problems.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenmill.common.io import record_shards, shards_as_written
from tokenmill.common.parallel import map_ordered

MAX_PROBLEMS = 20  # problems listed in a check's metadata; the count is always complete


def validate_records(stage_dir: Path) -> dict:
    """Every line of every shard is a record
    {"id": str, "text": str, "meta": dict, "source": {"path", "line"|"index"}}, with an id no earlier line has:
    from the figures when they show it (the shards as written, every id distinct), else by audit_records."""
    figures = shards_as_written(stage_dir)
    if figures is not None and figures.get("unique_ids"):
        return {"records": sum(f["records"] for f in figures["shards"]), "problems": [], "audit": "figures"}
    return audit_records(stage_dir)


def audit_records(stage_dir: Path) -> dict:
    """validate_records by parsing every line. Shards are read in parallel (map_ordered); ids are compared across
    shards here, in shard order."""
    problems, records, ids = [], 0, set()
    shards = record_shards(stage_dir)
    for shard, lines in zip(shards, map_ordered(shard_record_ids, shards)):
        for n, problem, record_id in lines:
            records += 1
            if problem is not None:
                problems.append(f"{shard.name}:{n}: {problem}")
            elif record_id in ids:
                problems.append(f"{shard.name}:{n}: duplicate id {record_id}")
            else:
                ids.add(record_id)
    return {"records": records, "problems": problems, "audit": "records"}


def shard_record_ids(shard: Path) -> list[tuple[int, str | None, str | None]]:
    """(line number, what is wrong with the line or None, the record's id) for each line of one shard."""
    lines: list[tuple[int, str | None, str | None]] = []
    with open(shard, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                lines.append((n, f"not JSON ({e.msg})", None))
                continue
            except RecursionError:  # a reader lets no such record through; a check must not crash on one
                lines.append((n, "nested too deeply to parse", None))
                continue
            src = r.get("source") if isinstance(r, dict) else None
            if not (
                isinstance(r, dict)
                and isinstance(r.get("id"), str)
                and isinstance(r.get("text"), str)
                and isinstance(r.get("meta"), dict)
                and isinstance(src, dict)
                and "path" in src
                and ("line" in src or "index" in src)
            ):
                lines.append((n, "does not match the record schema", None))
            else:
                lines.append((n, None, r["id"]))
    return lines
