"""Rule 7 of cleaning, the boilerplate detector: merge of the line statistics, a joint score, stripping (pass 2).

A line is boilerplate when it is *mechanically* repeated: many documents carry it (document frequency), it
sits locked in the same edge of the document (positional consistency: first/last lines or first/last 5%),
it looks like a template (fixed delimiters `|` `©` `【】` `[]`, URLs, "All rights reserved", "转载", navigation
phrases, digits of a date or page number) and it is short. Frequency alone never strips a line: a frequent
line found in varied positions (a refrain, 春/月 verse) scores low on position and is never stripped; a line
locked at one edge but with no template trait (a speaker label "ROMEO:" opening every speech of a play) needs
to sit in about 8% of all documents before the other components can carry it over the threshold, and a label
line (short, ending in a colon) counts against the template component (see SCORE_WEIGHTS and LABEL_RE).

Pass 1 (per shard, `line_stats`) hashes each normalized line to 64 bits and returns numpy arrays of per-line
counts; `merge_line_stats` sums them and keeps lines with df >= min_df (memory: 48 bytes per distinct line per shard,
only numpy arrays cross process boundaries); `prune_candidates` drops, vectorized, the candidates that cannot
reach the threshold; pass 2 looks each line's hash up in that small table and scores a candidate once (its text
is first seen there), so nothing but hashes and counts is ever held corpus-wide.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np

from tokenmill.stages.clean.line_stats import COUNT_FIELDS, LineTable, doc_line_hashes, line_key, load_lines

# template traits, each with its weight in template_score (capped at 1)
TEMPLATE_TRAITS = [
    ("url", 1.0, re.compile(r"https?://|www\.|\.(?:com|org|net|cn|io)\b|@\w+\.\w+")),
    (
        "copyright",
        1.0,
        re.compile(
            r"©|\(c\)|copyright|all rights reserved|版权所有|版權所有|转载|轉載|未经授权|"
            r"本文来源|本文來源|原创声明|免责声明|"
            r"privacy policy|terms of (?:use|service)",
            re.I,
        ),
    ),
    (
        "navigation",
        0.8,
        re.compile(
            r"click (?:here|to)|read more|next page|previous page|subscribe|"
            r"sign (?:in|up)|log ?in|share (?:this|on)|follow us|back to top|cookie|"
            r"advertisement|"
            r"上一页|下一页|上一篇|下一篇|点击|點擊|阅读全文|閱讀全文|返回|首页|首頁|关注|關注|"
            r"扫码|掃碼|公众号|公眾號|广告|廣告|展开全文|收起|登录|登錄|注册|註冊",
            re.I,
        ),
    ),
    ("delimiters", 0.6, re.compile(r"\s[|｜•·»›/]\s|\S\s?[|｜]\s?\S|^[|｜]|[|｜]$|>>|<<")),
    ("brackets", 0.5, re.compile(r"^[【\[〖《].*[】\]〗》]$|^【|】$|^\[.{0,30}\]")),
    ("rule", 0.6, re.compile(r"^[-=*_~#·.。—]{3,}$")),
    (
        "signature",
        0.8,
        re.compile(
            r"sent from my|sent via|posted (?:from|via)|excuse (?:any |the )?typos|"
            r"发自我的|来自我的|來自我的|发自iphone|来自iphone",
            re.I,
        ),
    ),
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


def merge_line_stats(parts: list[LineTable], min_df: int) -> LineTable:
    """Sums per-shard line statistics and keeps lines with df >= min_df (the candidates), sorted by hash."""
    docs = sum(p.docs for p in parts)
    if not any(len(p) for p in parts):
        return LineTable.empty(docs)
    hashes = np.concatenate([p.hash for p in parts])
    # a stable (radix) sort: faster than np.unique's (docs/profile.md, 'What changed in this round'), and each line's
    # counts are summed in shard order, as before
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    first = np.ones(len(hashes), dtype=bool)
    first[1:] = hashes[1:] != hashes[:-1]
    line = np.cumsum(first) - 1
    sums = {
        k: np.bincount(line, weights=np.concatenate([getattr(p, k) for p in parts])[order], minlength=int(line[-1]) + 1)
        for k in COUNT_FIELDS
    }
    keep = sums["df"] >= max(1, min_df)
    return LineTable(
        docs=docs,
        hash=hashes[first][keep],
        df=sums["df"][keep],
        head=sums["head"][keep],
        tail=sums["tail"][keep],
        informative=sums["informative"][keep],
        chance=sums["chance"][keep],
    )


@dataclass(frozen=True, kw_only=True)
class MergeTask:
    """The corpus-wide statistics of the lines whose hash is in [lo, hi): each shard's rows of that range."""

    shards: tuple[tuple[str, int], ...]  # per shard, in order: its line-statistics file (save_lines), its documents
    lo: int
    hi: int
    min_df: int
    threshold: float


def merge_task(task: MergeTask) -> LineTable:
    """The candidates of one hash range, merged and pruned (a line's rows are all in its range, so the ranges'
    candidates, in order, are those of one merge over every shard)."""
    parts = [load_lines(path, docs, task.lo, task.hi) for path, docs in task.shards]
    return prune_candidates(merge_line_stats(parts, task.min_df), task.threshold)


def prune_candidates(merged: LineTable, threshold: float) -> LineTable:
    """Keeps the candidates that can still be stripped: positionally consistent (pos >= MIN_POS_SCORE) and with
    a score that reaches `threshold` if template and short components were at their maximum. Vectorized; what
    is left (usually a handful of lines) is scored with its text in pass 2."""
    n = len(merged)
    if not n:
        return merged
    docs = max(1, int(merged.docs))
    frac = merged.df / docs
    dfs = np.clip(np.log(np.maximum(frac, 1e-12) / DF_FLOOR) / math.log(DF_SATURATE / DF_FLOOR), 0.0, 1.0)
    inf = merged.informative.astype(np.float64)
    safe = np.maximum(inf, 1.0)
    consistency = np.maximum(merged.head, merged.tail) / safe
    expected = np.minimum(0.99, merged.chance / safe)
    pos = np.where(inf > 0, np.maximum(0.0, (consistency - expected) / (1.0 - expected)), 0.0)
    best = (
        SCORE_WEIGHTS["df"] * dfs + SCORE_WEIGHTS["position"] * pos + SCORE_WEIGHTS["template"] + SCORE_WEIGHTS["short"]
    )
    keep = (pos >= MIN_POS_SCORE - 1e-9) & (best >= threshold - 1e-9)
    return replace(merged.select(keep), candidates=n)


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


def score_line(key: str, df: float, head: float, tail: float, informative: float, chance: float, docs: int) -> dict:
    """The joint boilerplate score of one candidate line with its components."""
    tpl, traits = template_score(key)
    comp = {
        "df": df_score(df, docs),
        "position": position_score(head, tail, informative, chance),
        "template": tpl,
        "short": short_score(len(key)),
    }
    score = sum(SCORE_WEIGHTS[k] * v for k, v in comp.items())
    return {
        "score": round(score, 4),
        **{k: round(v, 4) for k, v in comp.items()},
        "traits": traits,
        "df": int(df),
        "head": int(head),
        "tail": int(tail),
        "informative": int(informative),
    }


class BoilerplateTable:
    """Pass-2 lookup: candidate hash -> score (computed lazily, once per candidate per worker)."""

    def __init__(self, merged: LineTable, threshold: float):
        self.docs = int(merged.docs)
        self.threshold = threshold
        self.index = {int(h): i for i, h in enumerate(merged.hash.tolist())}
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
            info = score_line(
                key,
                float(m.df[i]),
                float(m.head[i]),
                float(m.tail[i]),
                float(m.informative[i]),
                float(m.chance[i]),
                self.docs,
            )
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
