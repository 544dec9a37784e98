"""Boilerplate detector: corpus-wide line statistics (pass 1), a small merge, a joint score, stripping (pass 2).

A line is boilerplate when it is *mechanically* repeated: many documents carry it (document frequency), it
sits locked in the same edge of the document (positional consistency: first/last lines or first/last 5%),
it looks like a template (fixed delimiters `|` `©` `【】` `[]`, URLs, "All rights reserved", "转载", navigation
phrases, digits of a date or page number) and it is short. Frequency alone never strips a line: a frequent
line found in varied positions (a refrain, a speaker name in a play, 春/月 verse) scores low on position, and
a frequent line with no template traits needs a document frequency no genuine line reaches (see SCORE_*).

Pass 1 (per shard) hashes each normalized line to 64 bits and returns numpy arrays of per-line counts;
`merge_line_stats` sums them and keeps lines with df >= min_df (memory: 28 bytes per distinct line per shard,
only numpy arrays cross process boundaries); pass 2 looks each line's hash up in that small table and scores a
candidate once (its text is first seen there), so nothing but hashes and counts is ever held corpus-wide.
"""
from __future__ import annotations

import math
import re
import zlib

import numpy as np

DIGITS_RE = re.compile(r"\d+")
HAS_DIGIT = re.compile(r"\d").search
# template traits, each with its weight in template_score (capped at 1)
TEMPLATE_TRAITS = [
    ("url", 1.0, re.compile(r"https?://|www\.|\.(?:com|org|net|cn|io)\b|@\w+\.\w+")),
    ("copyright", 1.0, re.compile(r"©|\(c\)|copyright|all rights reserved|版权所有|版權所有|转载|轉載|未经授权|"
                                  r"本文来源|本文來源|原创声明|免责声明|privacy policy|terms of (?:use|service)", re.I)),
    ("navigation", 0.8, re.compile(r"click (?:here|to)|read more|next page|previous page|subscribe|sign (?:in|up)|"
                                   r"log ?in|share (?:this|on)|follow us|back to top|cookie|advertisement|"
                                   r"上一页|下一页|上一篇|下一篇|点击|點擊|阅读全文|閱讀全文|返回|首页|首頁|关注|關注|"
                                   r"扫码|掃碼|公众号|公眾號|广告|廣告|展开全文|收起|登录|登錄|注册|註冊", re.I)),
    ("delimiters", 0.6, re.compile(r"\s[|｜•·»›/]\s|\S\s?[|｜]\s?\S|^[|｜]|[|｜]$|>>|<<")),
    ("brackets", 0.5, re.compile(r"^[【\[〖《].*[】\]〗》]$|^【|】$|^\[.{0,30}\]")),
    ("rule", 0.6, re.compile(r"^[-=*_~#·.。—]{3,}$")),
    ("signature", 0.8, re.compile(r"sent from my|sent via|posted (?:from|via)|excuse (?:any |the )?typos|"
                                  r"发自我的|来自我的|來自我的|发自iphone|来自iphone", re.I)),
    ("digits", 0.3, re.compile(r"\d")),
]
# a short line ending in a colon is a label that introduces what follows (a speaker in a play, "Chorus:",
# "Q:", "注："): structure of the text, not a site template, so it counts against the template score
LABEL_RE = re.compile(r"^[^\s:：|©【\[]+(?:\s[^\s:：|©]+){0,3}\s?[:：]$")
LABEL_PENALTY = 0.5
# joint score = sum of weight * component; a line is stripped when the score passes the threshold AND it is
# positionally consistent (pos_score >= MIN_POS_SCORE): position is the trait genuine frequent lines lack.
SCORE_WEIGHTS = {"df": 0.30, "position": 0.30, "template": 0.30, "short": 0.10}
MIN_POS_SCORE = 0.5
# df component: log-scaled share of documents; 0 at DF_FLOOR of the corpus, 1 at DF_SATURATE (a line in 20% of
# all documents). The top speaker of tinyshakespeare (GLOUCESTER:, 3.2% of blocks) scores 0.65 here.
DF_FLOOR, DF_SATURATE = 0.001, 0.20
# short component: 1 for a line of SHORT_FULL characters or fewer, 0 from SHORT_ZERO characters on
SHORT_FULL, SHORT_ZERO = 20, 120


def line_key(line: str, digits: bool = True) -> str:
    """The form lines are compared in: stripped, lower-cased, every digit run as 0 ("Page 3 of 10" and
    "Page 4 of 10" are the same template). `digits=False` says the caller knows there are none."""
    s = line.strip().lower()
    return DIGITS_RE.sub("0", s) if digits else s


def key_hash(key: str) -> int:
    """Stable 64-bit hash of a line key (Python's hash() differs per process): crc32 and adler32 side by side."""
    b = key.encode("utf-8")
    return (zlib.crc32(b) << 32) | zlib.adler32(b)


def edge_zone(n_lines: int, edge_frac: float) -> int:
    """Lines at each end of a document counted as header/footer: the first/last `edge_frac` of lines, at least 1."""
    return max(1, math.ceil(edge_frac * n_lines))


class LineStats:
    """Per-shard accumulator of line statistics (pass 1)."""

    def __init__(self, edge_frac: float = 0.05):
        self.edge_frac = edge_frac
        self.hashes: list[int] = []
        self.head: list[int] = []
        self.tail: list[int] = []
        self.informative: list[int] = []
        self.chance: list[float] = []
        self.length: list[int] = []
        self.docs = 0

    def add_document(self, text: str) -> None:
        """Records each distinct line of one document once (document frequency), with where it sits."""
        self.docs += 1
        lines = [ln for ln in text.split("\n") if ln.strip()]
        n = len(lines)
        zone = edge_zone(n, self.edge_frac)
        # a one-line document says nothing about position; from two lines on, being first (or last) every time
        # is evidence, weighed against the chance zone/n of landing there at random
        informative = int(n >= 2)
        chance = zone / n if informative else 0.0
        seen = set()
        digits = HAS_DIGIT(text) is not None
        for i, line in enumerate(lines):
            key = line_key(line, digits)
            h = key_hash(key)
            if h in seen:
                continue
            seen.add(h)
            self.hashes.append(h)
            self.head.append(informative and i < zone)
            self.tail.append(informative and i >= n - zone)
            self.informative.append(informative)
            self.chance.append(chance)
            self.length.append(len(key))

    def arrays(self) -> dict:
        """Per distinct line hash: df, head, tail, informative occurrences, summed chance, key length."""
        if not self.hashes:
            return {"docs": self.docs, "hash": np.zeros(0, np.uint64), "df": np.zeros(0, np.int32),
                    "head": np.zeros(0, np.int32), "tail": np.zeros(0, np.int32),
                    "informative": np.zeros(0, np.int32), "chance": np.zeros(0, np.float32),
                    "length": np.zeros(0, np.int32)}
        h = np.array(self.hashes, dtype=np.uint64)
        uniq, inv = np.unique(h, return_inverse=True)
        m = len(uniq)
        out = {"docs": self.docs, "hash": uniq,
               "df": np.bincount(inv, minlength=m).astype(np.int32),
               "head": np.bincount(inv, weights=np.array(self.head, np.float64), minlength=m).astype(np.int32),
               "tail": np.bincount(inv, weights=np.array(self.tail, np.float64), minlength=m).astype(np.int32),
               "informative": np.bincount(inv, weights=np.array(self.informative, np.float64),
                                          minlength=m).astype(np.int32),
               "chance": np.bincount(inv, weights=np.array(self.chance, np.float64), minlength=m).astype(np.float32),
               "length": np.zeros(m, np.int32)}
        out["length"][inv] = np.array(self.length, np.int32)
        return out


def merge_line_stats(parts: list[dict], min_df: int) -> dict:
    """Sums per-shard line statistics and keeps lines with df >= min_df (the candidates), sorted by hash."""
    docs = sum(p["docs"] for p in parts)
    keys = ("df", "head", "tail", "informative", "chance")
    if not parts or not any(len(p["hash"]) for p in parts):
        return {"docs": docs, "hash": np.zeros(0, np.uint64), **{k: np.zeros(0) for k in keys},
                "length": np.zeros(0, np.int32)}
    h = np.concatenate([p["hash"] for p in parts])
    uniq, inv = np.unique(h, return_inverse=True)
    m = len(uniq)
    df = np.bincount(inv, weights=np.concatenate([p["df"] for p in parts]), minlength=m)
    keep = df >= max(1, min_df)
    out = {"docs": docs, "hash": uniq[keep], "df": df[keep].astype(np.int64)}
    for k in keys[1:]:
        out[k] = np.bincount(inv, weights=np.concatenate([p[k] for p in parts]), minlength=m)[keep]
    length = np.zeros(m, np.int32)
    length[inv] = np.concatenate([p["length"] for p in parts])
    out["length"] = length[keep]
    return out


def template_score(key: str) -> tuple[float, list[str]]:
    """How much a line looks like a site template: the weights of the traits it shows, capped at 1, less
    LABEL_PENALTY for a label line (so the component ranges from -0.5 to 1)."""
    score, traits = 0.0, []
    for name, weight, rx in TEMPLATE_TRAITS:
        if rx.search(key):
            score += weight
            traits.append(name)
    score = min(1.0, score)
    if LABEL_RE.match(key):
        score -= LABEL_PENALTY
        traits.append("label")
    return score, traits


def position_score(head: float, tail: float, informative: float, chance: float) -> float:
    """Positional consistency: the share of a line's occurrences locked in one edge (head or tail), rescaled so
    that what chance alone gives (a line placed at random) is 0 and 'always in that edge' is 1. Occurrences in
    documents too short to tell are left out; with none left the line scores 0 (no evidence)."""
    if informative <= 0:
        return 0.0
    consistency = max(head, tail) / informative
    expected = min(0.99, chance / informative)
    return max(0.0, (consistency - expected) / (1.0 - expected))


def df_score(df: float, docs: int) -> float:
    frac = df / max(1, docs)
    if frac <= DF_FLOOR:
        return 0.0
    return min(1.0, math.log(frac / DF_FLOOR) / math.log(DF_SATURATE / DF_FLOOR))


def short_score(length: int) -> float:
    return min(1.0, max(0.0, (SHORT_ZERO - length) / (SHORT_ZERO - SHORT_FULL)))


def score_line(key: str, df: float, head: float, tail: float, informative: float, chance: float,
               docs: int) -> dict:
    """The joint boilerplate score of one candidate line with its components."""
    tpl, traits = template_score(key)
    comp = {"df": df_score(df, docs), "position": position_score(head, tail, informative, chance),
            "template": tpl, "short": short_score(len(key))}
    score = sum(SCORE_WEIGHTS[k] * v for k, v in comp.items())
    return {"score": round(score, 4), **{k: round(v, 4) for k, v in comp.items()}, "traits": traits,
            "df": int(df), "head": int(head), "tail": int(tail), "informative": int(informative)}


class BoilerplateTable:
    """Pass-2 lookup: candidate hash -> score (computed lazily, once per candidate per worker)."""

    def __init__(self, merged: dict, threshold: float):
        self.docs = int(merged["docs"])
        self.threshold = threshold
        self.index = {int(h): i for i, h in enumerate(merged["hash"].tolist())}
        self.m = merged
        self.cache: dict[int, dict] = {}

    def __len__(self) -> int:
        return len(self.index)

    def judge(self, key: str, h: int) -> dict | None:
        """Score info when the line is stripped, else None."""
        i = self.index.get(h)
        if i is None:
            return None
        info = self.cache.get(h)
        if info is None:
            m = self.m
            info = score_line(key, float(m["df"][i]), float(m["head"][i]), float(m["tail"][i]),
                              float(m["informative"][i]), float(m["chance"][i]), self.docs)
            info["strip"] = bool(info["score"] >= self.threshold and info["position"] >= MIN_POS_SCORE)
            self.cache[h] = info
        return info if info["strip"] else None

    def strip(self, text: str) -> tuple[str, list[tuple[int, str, dict]]]:
        """Removes the boilerplate lines of one text; returns (text, [(hash, line, info)] of stripped lines)."""
        if not self.index:
            return text, []
        lines = text.split("\n")
        kept, stripped = [], []
        digits = HAS_DIGIT(text) is not None
        for line in lines:
            if line.strip():
                key = line_key(line, digits)
                h = key_hash(key)
                if h in self.index:
                    info = self.judge(key, h)
                    if info is not None:
                        stripped.append((h, line.strip(), info))
                        continue
            kept.append(line)
        if not stripped:
            return text, []
        out = "\n".join(kept).strip("\n")
        while "\n\n\n" in out:
            out = out.replace("\n\n\n", "\n\n")
        return out, stripped
