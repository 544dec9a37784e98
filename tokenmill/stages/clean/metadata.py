"""Rule 6 of cleaning: title/author/dynasty/date/source header lines moved from the top of a text into meta."""

from __future__ import annotations

import re

# header lines at the top of a text: "Title: ...", "作者：..." (label -> meta key)
META_LABELS = {
    "title": "title",
    "标题": "title",
    "標題": "title",
    "题目": "title",
    "題目": "title",
    "诗名": "title",
    "詩名": "title",
    "篇名": "title",
    "词牌": "title",
    "詞牌": "title",
    "author": "author",
    "作者": "author",
    "poet": "author",
    "writer": "author",
    "诗人": "author",
    "詩人": "author",
    "dynasty": "dynasty",
    "朝代": "dynasty",
    "年代": "dynasty",
    "时代": "dynasty",
    "時代": "dynasty",
    "date": "date",
    "日期": "date",
    "published": "date",
    "时间": "date",
    "時間": "date",
    "发布时间": "date",
    "source": "source",
    "来源": "source",
    "來源": "source",
    "出处": "source",
    "出處": "source",
    "url": "url",
    "链接": "url",
    "tags": "tags",
    "标签": "tags",
    "category": "category",
    "分类": "category",
}
META_LINE_RE = re.compile(
    r"^\s*(?:[#*>]+\s*)?("
    + "|".join(sorted(map(re.escape, META_LABELS), key=len, reverse=True))
    + r")\s*[:：]\s*(.{1,200}?)\s*$",
    re.I,
)
BY_LINE_RE = re.compile(r"^\s*(?:[Bb]y|[Ww]ritten [Bb]y)\s+([A-Z][\w.'\-]*(?:\s+[A-Z][\w.'\-]*){0,3})\s*$")
# "〔唐〕李白", "[宋] 苏轼", "（唐）王维": dynasty + author on one line
DYNASTY_AUTHOR_RE = re.compile(r"^\s*[\[〔【（(]\s*(\S{1,3})\s*[\]〕】）)]\s*(\S{1,8})\s*$")
META_KEYS_FROM_READER = {
    "title": ("title", "rhythmic", "name"),
    "author": ("author", "authors", "writer", "poet"),
    "dynasty": ("dynasty",),
    "date": ("date",),
}


def extract_metadata(text: str, meta: dict, max_header_lines: int = 6) -> tuple[str, dict, int]:
    """Moves title/author/dynasty/date/source header lines out of the top of `text` into `meta`.

    Only the leading block of lines is looked at (at most `max_header_lines`, stopping at the first line that
    is not a header), so a "Title:" inside the body stays. A leading line equal to the title or author the
    reader already found is dropped as a repeat of that field. A value the reader found wins over one from the
    text (the text's value is then discarded). Returns (text, meta, number of lines moved).
    """
    if not text:
        return text, meta, 0
    cut = text.find("\n")
    first = text if cut < 0 else text[:cut]
    if not (":" in first or "：" in first or first[:1] in "[〔【（(" or first[:3].lower() in ("by ", "wri")):
        fs = first.strip()
        if fs != meta.get("title") and fs != meta.get("author"):
            return text, meta, 0  # fast path: the first line is no header (nearly every text)
    lines = text.split("\n", max_header_lines)
    known = {meta.get(k) for keys in META_KEYS_FROM_READER.values() for k in keys if isinstance(meta.get(k), str)}
    known.discard("")
    moved = 0
    found: dict[str, str] = {}
    for i, line in enumerate(lines[:max_header_lines]):
        s = line.strip()
        if not s:
            if moved:
                moved += 1  # a blank line right after a header block goes with it
                continue
            break
        m = META_LINE_RE.match(s)
        if m:
            found.setdefault(META_LABELS[m.group(1).lower()], m.group(2))
        elif s in known:
            pass  # the reader's title/author repeated as the first lines
        elif i == moved and (bm := BY_LINE_RE.match(s)) and "author" not in found:
            found["author"] = bm.group(1)
        elif (dm := DYNASTY_AUTHOR_RE.match(s)) and i == moved and moved and "author" not in found:
            found.setdefault("dynasty", dm.group(1))
            found["author"] = dm.group(2)
        else:
            break
        moved = i + 1
    if not moved:
        return text, meta, 0
    body = "\n".join(lines[moved:]).lstrip("\n")
    if not body.strip():
        return text, meta, 0  # a text that is only header lines is left alone (the filters will judge it)
    meta = dict(meta)
    for k, v in found.items():
        if not (isinstance(meta.get(k), str) and meta[k].strip()):
            meta[k] = v
    return body, meta, moved
