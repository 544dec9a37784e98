"""Boilerplate detector: corpus-wide line statistics (pass 1), a small merge, a joint score, stripping (pass 2).

A line is boilerplate when it is *mechanically* repeated: many documents carry it (document frequency), it
sits locked in the same edge of the document (positional consistency: first/last lines or first/last 5%),
it looks like a template (fixed delimiters `|` `©` `【】` `[]`, URLs, "All rights reserved", "转载", navigation
phrases, digits of a date or page number) and it is short. Frequency alone never strips a line: a frequent
line found in varied positions (a refrain, 春/月 verse) scores low on position and is never stripped; a line
locked at one edge but with no template trait (a speaker label "ROMEO:" opening every speech of a play) needs
to sit in about 8% of all documents before the other components can carry it over the threshold, and a label
line (short, ending in a colon) counts against the template component (see SCORE_WEIGHTS and LABEL_RE).

Pass 1 (per shard) hashes each normalized line to 64 bits and returns numpy arrays of per-line counts;
`merge_line_stats` sums them and keeps lines with df >= min_df (memory: 48 bytes per distinct line per shard,
only numpy arrays cross process boundaries); `prune_candidates` drops, vectorized, the candidates that cannot
reach the threshold; pass 2 looks each line's hash up in that small table and scores a candidate once (its text
is first seen there), so nothing but hashes and counts is ever held corpus-wide.
"""
from __future__ import annotations

import math
import re
from zlib import adler32, crc32

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


def line_key(line: str) -> str:
    """The form lines are compared in: lower-cased, without surrounding spaces/tabs, every digit run as 0
    ("Page 3 of 10" and "Page 4 of 10" are the same template)."""
    return DIGITS_RE.sub("0", line.lower()).strip(" \t")


def key_hash(key: str) -> int:
    """Stable 64-bit hash of a line key (Python's hash() differs per process): crc32 and adler32 side by side."""
    b = key.encode("utf-8")
    return (crc32(b) << 32) | adler32(b)


def doc_lines(text: str) -> list[str]:
    """The lines the detector looks at: the non-blank lines of a text, in order."""
    return [ln for ln in text.split("\n") if ln and not ln.isspace()]


def doc_line_hashes(text: str) -> list[int]:
    """key_hash(line_key(line)) of every line of doc_lines(text), in order, computed for the whole text at once
    (one lower(), one digit pass: about half the cost of doing it line by line)."""
    low = text.lower()  # lower() never adds or removes a line break, so the lines stay aligned with doc_lines
    if HAS_DIGIT(low) is not None:
        low = DIGITS_RE.sub("0", low)
    return [(crc32(b) << 32) | adler32(b)
            for b in (ln.strip(" \t").encode("utf-8") for ln in low.split("\n") if ln and not ln.isspace())]


def edge_zone(n_lines: int, edge_frac: float) -> int:
    """Lines at each end of a document counted as header/footer: the first/last `edge_frac` of lines, at least 1."""
    return max(1, math.ceil(edge_frac * n_lines))


HEAD, TAIL, INFORMATIVE = 1, 2, 4  # bits of a line occurrence's position code


class LineStats:
    """Per-shard accumulator of line statistics (pass 1): per distinct line of each document, its hash and a
    position code; per document, the chance of landing in one edge zone at random."""

    def __init__(self, edge_frac: float = 0.05):
        self.edge_frac = edge_frac
        self.hashes: list[int] = []
        self.codes: list[int] = []
        self.doc_entries: list[int] = []
        self.doc_chance: list[float] = []
        self.docs = 0

    def add_document(self, text: str) -> list[int]:
        """Records each distinct line of one document once (document frequency), with where it sits; returns
        the hash of every line of doc_lines(text) in order (pass 2 looks them up without hashing again)."""
        self.docs += 1
        hashes = doc_line_hashes(text)
        n = len(hashes)
        if n == 0:
            self.doc_entries.append(0)
            self.doc_chance.append(0.0)
            return hashes
        zone = edge_zone(n, self.edge_frac)
        # a one-line document says nothing about position; from two lines on, being first (or last) every time
        # is evidence, weighed against the chance zone/n of landing there at random
        self.doc_chance.append(zone / n if n >= 2 else 0.0)
        if len(set(hashes)) == n:  # every line distinct (the common case): positions are the line numbers
            self.hashes += hashes
            self.codes += ([INFORMATIVE | HEAD] * zone + [INFORMATIVE] * (n - 2 * zone) + [INFORMATIVE | TAIL] * zone
                           if n >= 2 else [0])
            self.doc_entries.append(n)
            return hashes
        # a line repeated inside the document: its first and last position decide (repeated across the
        # document, it is locked nowhere)
        where: dict[int, list] = {}
        for i, h in enumerate(hashes):
            w = where.get(h)
            if w is None:
                where[h] = [i, i]
            else:
                w[1] = i
        for h, (first, last) in where.items():
            self.hashes.append(h)
            self.codes.append(INFORMATIVE | (HEAD if last < zone else 0) | (TAIL if first >= n - zone else 0))
        self.doc_entries.append(len(where))
        return hashes

    def arrays(self) -> dict:
        """Per distinct line hash of the shard: df, head, tail, informative occurrences, summed chance."""
        if not self.hashes:
            return {"docs": self.docs, "hash": np.zeros(0, np.uint64),
                    **{k: np.zeros(0, np.float64) for k in ("df", "head", "tail", "informative", "chance")}}
        h = np.array(self.hashes, dtype=np.uint64)
        codes = np.array(self.codes, dtype=np.uint8)
        informative = (codes & INFORMATIVE) > 0
        chance = np.repeat(np.array(self.doc_chance), np.array(self.doc_entries)) * informative
        uniq, inv = np.unique(h, return_inverse=True)
        m = len(uniq)
        return {"docs": self.docs, "hash": uniq,
                "df": np.bincount(inv, minlength=m).astype(np.float64),
                "head": np.bincount(inv, weights=(codes & HEAD) > 0, minlength=m),
                "tail": np.bincount(inv, weights=(codes & TAIL) > 0, minlength=m),
                "informative": np.bincount(inv, weights=informative, minlength=m),
                "chance": np.bincount(inv, weights=chance, minlength=m)}


def merge_line_stats(parts: list[dict], min_df: int) -> dict:
    """Sums per-shard line statistics and keeps lines with df >= min_df (the candidates), sorted by hash."""
    docs = sum(p["docs"] for p in parts)
    keys = ("df", "head", "tail", "informative", "chance")
    if not parts or not any(len(p["hash"]) for p in parts):
        return {"docs": docs, "hash": np.zeros(0, np.uint64), **{k: np.zeros(0) for k in keys}}
    h = np.concatenate([p["hash"] for p in parts])
    uniq, inv = np.unique(h, return_inverse=True)
    m = len(uniq)
    df = np.bincount(inv, weights=np.concatenate([p["df"] for p in parts]), minlength=m)
    keep = df >= max(1, min_df)
    out = {"docs": docs, "hash": uniq[keep], "df": df[keep]}
    for k in keys[1:]:
        out[k] = np.bincount(inv, weights=np.concatenate([p[k] for p in parts]), minlength=m)[keep]
    return out


def prune_candidates(merged: dict, threshold: float) -> dict:
    """Keeps the candidates that can still be stripped: positionally consistent (pos >= MIN_POS_SCORE) and with
    a score that reaches `threshold` if template and short components were at their maximum. Vectorized; what
    is left (usually a handful of lines) is scored with its text in pass 2."""
    n = len(merged["hash"])
    if not n:
        return merged
    docs = max(1, int(merged["docs"]))
    frac = merged["df"] / docs
    dfs = np.clip(np.log(np.maximum(frac, 1e-12) / DF_FLOOR) / math.log(DF_SATURATE / DF_FLOOR), 0.0, 1.0)
    inf = merged["informative"].astype(np.float64)
    safe = np.maximum(inf, 1.0)
    consistency = np.maximum(merged["head"], merged["tail"]) / safe
    expected = np.minimum(0.99, merged["chance"] / safe)
    pos = np.where(inf > 0, np.maximum(0.0, (consistency - expected) / (1.0 - expected)), 0.0)
    best = (SCORE_WEIGHTS["df"] * dfs + SCORE_WEIGHTS["position"] * pos + SCORE_WEIGHTS["template"]
            + SCORE_WEIGHTS["short"])
    keep = (pos >= MIN_POS_SCORE - 1e-9) & (best >= threshold - 1e-9)
    return {"docs": merged["docs"], "candidates": n, **{k: v[keep] for k, v in merged.items()
                                                         if isinstance(v, np.ndarray)}}


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

    def strip(self, text: str, hashes: list[int] | None = None) -> tuple[str, list[tuple[int, str, dict]]]:
        """Removes the boilerplate lines of one text; returns (text, [(hash, line, info)] of stripped lines).
        `hashes`: doc_line_hashes(text) when the caller has them already."""
        if not self.index:
            return text, []
        if hashes is None:
            hashes = doc_line_hashes(text)
        kept, stripped, j = [], [], 0
        for line in text.split("\n"):
            if line and not line.isspace():
                h = hashes[j]
                j += 1
                if h in self.index:
                    info = self.judge(line_key(line), h)
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
