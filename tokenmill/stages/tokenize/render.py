"""Rendering: one record -> the segments of each key of its training type (docs/format.md, "Keys by training type").

A segment is a special token (by id) or a text piece, with a mask bit (1 = trained). Text pieces are encoded later,
a batch at a time (encode.py); special tokens are inserted by id, so a literal "</s>" in a poem stays text. Each
renderer checks every field it needs before it appends anything, and returns the reason a record cannot be rendered
(None when it was).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tokenmill.stages.tokenize.settings import AUTO_CONDITIONAL_SHARE, ShardSettings
from tokenmill.stages.tokenize.tokenizer import hash64
from tokenmill_loader.format import GROUP_KEY, ROLE_TOKENS

Part = tuple[int | str, int]  # (special-token id, or text piece; mask bit)


class Segments:
    """The segments of a batch of records, per key, with the record ids and the conditional-rendering counts."""

    def __init__(self, keys: Iterable[str]):
        keys = list(keys)
        self.texts: list[str] = []
        self.src: dict[str, list[int]] = {k: [] for k in keys}  # >= 0: text piece index; < 0: -(special id) - 1
        self.mask: dict[str, list[int]] = {k: [] for k in keys}
        self.nseg: dict[str, list[int]] = {k: [] for k in keys}  # segments per item (values: values per item)
        self.nitems: dict[str, list[int]] = {k: [] for k in keys}  # items per record
        self.rewards: list[float] = []
        self.ids: list[str] = []
        self.dropout = 0  # conditional: records rendered without their title/author
        self.no_metadata = 0  # conditional: records that have neither

    def record(self, key: str, items: list[list[Part]]) -> None:
        """Appends one record's items of `key`."""
        src, mask = self.src[key], self.mask[key]
        for parts in items:
            for part, bit in parts:
                if isinstance(part, str):
                    src.append(len(self.texts))
                    self.texts.append(part)
                else:
                    src.append(-part - 1)
                mask.append(bit)
            self.nseg[key].append(len(parts))
        self.nitems[key].append(len(items))

    def values(self, key: str, values: list[float]) -> None:
        """Appends one record's values (grpo rewards): one item holding len(values) values."""
        self.rewards.extend(float(x) for x in values)
        self.nseg[key].append(len(values))
        self.nitems[key].append(1)


VAL_MOVED_KEY = "val_moved"  # a version's manifest: the train records moved into an empty val, by id


def split_hash(rid: str) -> int:
    """The record's place in the train/val split: val holds the ids whose hash is below val_fraction * 2**64."""
    return hash64("tokenmill-split", rid)


def split_of(rid: str, val_fraction: float) -> int:
    """0 (train) or 1 (val), by a hash of the record id: stable when records are added."""
    return 1 if split_hash(rid) < val_fraction * 2.0**64 else 0


def metadata_dropped(rid: str, seed: int, rate: float) -> bool:
    """conditional: this record is rendered without its title/author (per document, seeded)."""
    return rate > 0 and hash64("tokenmill-dropout", str(seed), rid) < rate * 2.0**64


def _str(x) -> str | None:
    return x if isinstance(x, str) else None


def render_seq(rec: dict, out: Segments, sp: dict[str, int], settings: ShardSettings) -> str | None:
    """`<s> text </s>`, every token trained."""
    text = _str(rec.get("text"))
    if not text:
        return "empty_text"
    out.record("sequence", [[(sp["<s>"], 1), (text, 1), (sp["</s>"], 1)]])
    return None


def title_author(rec: dict) -> tuple[str, str]:
    """The record's meta.title and meta.author ("" when absent or not text): what conditional renders."""
    meta = rec.get("meta")
    if not isinstance(meta, dict):
        meta = {}
    return _str(meta.get("title")) or "", _str(meta.get("author")) or ""


def render_conditional(rec: dict, out: Segments, sp: dict[str, int], settings: ShardSettings) -> str | None:
    """`<|title|>T<|author|>A<|content|>body</s>` with the prefix masked; metadata dropout keeps
    `<|content|>body</s>`."""
    text = _str(rec.get("text"))
    if not text:
        return "empty_text"
    title, author = title_author(rec)
    prefix: list[Part] = []
    if not title and not author:
        out.no_metadata += 1
    elif metadata_dropped(str(rec["id"]), settings.seed, settings.metadata_dropout):
        out.dropout += 1
    else:
        prefix = [(sp["<|title|>"], 0), (title, 0), (sp["<|author|>"], 0), (author, 0)]
    out.record("sequence", [prefix + [(sp["<|content|>"], 0), (text, 1), (sp["</s>"], 1)]])
    return None


def render_sft(rec: dict, out: Segments, sp: dict[str, int], settings: ShardSettings) -> str | None:
    """Chat template `<s><|role|>content<|end|>...</s>`; only assistant contents and their `<|end|>` trained."""
    msgs = rec.get("messages")
    if not isinstance(msgs, list) or not msgs:
        return "missing_messages"
    for m in msgs:
        if not (isinstance(m, dict) and m.get("role") in ROLE_TOKENS and isinstance(m.get("content"), str)):
            return "bad_message"
    if not any(m["role"] == "assistant" for m in msgs):
        return "no_assistant_turn"
    parts: list[Part] = [(sp["<s>"], 0)]
    for m in msgs:
        trained = 1 if m["role"] == "assistant" else 0
        parts += [(sp[ROLE_TOKENS[m["role"]]], 0), (m["content"], trained), (sp["<|end|>"], trained)]
    out.record("sequence", [parts + [(sp["</s>"], 0)]])
    return None


def _prompt(sp: dict[str, int], prompt: str) -> list[Part]:
    return [(sp["<s>"], 0), (sp["<|user|>"], 0), (prompt, 0), (sp["<|end|>"], 0), (sp["<|assistant|>"], 0)]


def _response(sp: dict[str, int], response: str) -> list[Part]:
    return [(response, 1), (sp["<|end|>"], 1), (sp["</s>"], 1)]


def render_dpo(rec: dict, out: Segments, sp: dict[str, int], settings: ShardSettings) -> str | None:
    """`chosen` and `rejected`: prompt (masked) + response (trained), one item each."""
    prompt, chosen, rejected = _str(rec.get("prompt")), _str(rec.get("chosen")), _str(rec.get("rejected"))
    if prompt is None or chosen is None or rejected is None:
        return "missing_dpo_fields"
    for key, response in (("chosen", chosen), ("rejected", rejected)):
        out.record(key, [_prompt(sp, prompt) + _response(sp, response)])
    return None


def render_grpo(rec: dict, out: Segments, sp: dict[str, int], settings: ShardSettings) -> str | None:
    """`prompts` (one item, masked), `responses` (one item per response, trained), rewards (one value each)."""
    prompt, responses, rewards = _str(rec.get("prompt")), rec.get("responses"), rec.get("rewards")
    if prompt is None or not isinstance(responses, list) or not responses or not isinstance(rewards, list):
        return "missing_grpo_fields"
    if not all(isinstance(x, str) for x in responses):
        return "bad_responses"
    if len(rewards) != len(responses) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in rewards
    ):
        return "rewards_mismatch"
    out.record("prompts", [_prompt(sp, prompt)])
    out.record("responses", [_response(sp, r) for r in responses])
    out.values(GROUP_KEY, rewards)
    return None


Renderer = Callable[[dict, Segments, dict, ShardSettings], "str | None"]
RENDERERS: dict[str, Renderer] = {
    "seq": render_seq,
    "conditional": render_conditional,
    "sft": render_sft,
    "dpo": render_dpo,
    "grpo": render_grpo,
}


@dataclass(frozen=True, kw_only=True)
class TrainingTypeChoice:
    """The training type a dataset generation is rendered with, and why: set explicitly, or chosen by auto from
    the records of the generation's first version (`records`, `with_metadata`: those with a title or author)."""

    setting: str
    resolved: str
    records: int = 0
    with_metadata: int = 0
    inherited: bool = field(default=False, compare=False)  # taken from the published generation
    guessed: bool = field(default=False, compare=False)  # from the first records only: to check against all

    MANIFEST_KEY = "training_type_choice"  # a version's manifest: what auto decided on (absent: set explicitly)

    @classmethod
    def explicit(cls, training_type: str) -> TrainingTypeChoice:
        return cls(setting=training_type, resolved=training_type)

    @classmethod
    def auto(cls, records: int, with_metadata: int, guessed: bool = False) -> TrainingTypeChoice:
        conditional = records > 0 and with_metadata >= AUTO_CONDITIONAL_SHARE * records
        return cls(
            setting="auto",
            resolved="conditional" if conditional else "seq",
            records=records,
            with_metadata=with_metadata,
            guessed=guessed,
        )

    @classmethod
    def published(cls, manifest: dict) -> TrainingTypeChoice | None:
        """The choice a published auto generation recorded (None: its type was set explicitly)."""
        found = manifest.get(cls.MANIFEST_KEY)
        if not isinstance(found, dict):
            return None
        return cls(
            setting="auto",
            resolved=manifest["training_type"],
            records=found["records"],
            with_metadata=found["with_title_or_author"],
            inherited=True,
        )

    def manifest_entry(self) -> dict:
        if self.setting != "auto":
            return {}
        return {self.MANIFEST_KEY: {"records": self.records, "with_title_or_author": self.with_metadata}}

    @property
    def reason(self) -> str:
        if self.setting != "auto":
            return "set explicitly"
        share = self.with_metadata / self.records if self.records else 0.0
        return (
            f"auto: {self.with_metadata:,} of {self.records:,} {'first ' if self.guessed else ''}records "
            f"({share:.1%}) carry a title or author; "
            f"conditional from {AUTO_CONDITIONAL_SHARE:.0%}"
        )
