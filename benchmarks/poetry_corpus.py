"""A chinese-poetry corpus of any size in the original layout: the Tang and Song files of ../shared, plus copies of
the Tang files whose characters are renamed by a seeded bijection (so a copy has the statistics of real poems
without duplicating them). Used where a benchmark asks for the ~355k-poem corpus (Tang, Song and the second Tang
edition) and only the Tang and Song files are at hand."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"
POETRY = SHARED / "corpora" / "chinese-poetry"
TANG = sorted((POETRY / "全唐诗").glob("poet.tang.*.json"))
SONG = sorted((POETRY / "宋词").glob("ci.song.*.json"))


def renamed(poems: list[dict], seed: int) -> list[dict]:
    """The poems with every CJK character mapped through a bijection of the CJK block seeded by `seed`."""
    block = [chr(c) for c in range(0x4E00, 0x9FA6)]
    shuffled = block[:]
    random.Random(seed).shuffle(shuffled)
    table = str.maketrans(dict(zip(block, shuffled)))
    return [
        {**p, "title": p.get("title", "").translate(table), "paragraphs": [s.translate(table) for s in p["paragraphs"]]}
        for p in poems
    ]


def write_copy(src: Path, dest: Path, seed: int) -> int:
    """`src` (a poet.tang.*.json) renamed with `seed`, written to `dest`; returns the number of poems."""
    poems = renamed(json.loads(src.read_text(encoding="utf-8")), seed)
    dest.write_text(json.dumps(poems, ensure_ascii=False), encoding="utf-8")
    return len(poems)


def build(folder: Path, poems: int = 355_000) -> int:
    """Tang + Song, then renamed Tang copies until about `poems` poems; returns the count."""
    if not TANG:
        raise SystemExit(f"no poet.tang.*.json under {POETRY / '全唐诗'}: the chinese-poetry corpus is needed")
    folder.mkdir(parents=True, exist_ok=True)
    count = 0
    for src in TANG + SONG:
        shutil.copy(src, folder / src.name)
        count += len(json.loads(src.read_text(encoding="utf-8")))
    copy = 1
    while count < poems:
        for src in TANG:
            if count >= poems:
                break
            count += write_copy(src, folder / f"copy{copy}.{src.name}", seed=copy)
        copy += 1
    return count
