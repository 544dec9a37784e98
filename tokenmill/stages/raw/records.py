"""Record mapping: one input object -> (text, meta, special top-level fields), presets for common layouts."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Rejected

# poetry layouts (chinese-poetry): the body is a list of lines under one of these keys
BODY_KEYS = ("paragraphs", "content", "para")
TITLE_KEYS = ("title", "rhythmic")
# top-level fields that training types after tokenization need; kept as they are (and chat `messages`)
DPO_KEYS = ("prompt", "chosen", "rejected")
GRPO_KEYS = ("prompt", "responses", "rewards")


@dataclass(kw_only=True)
class Mapped:
    text: str
    meta: dict = field(default_factory=dict)
    special: dict = field(default_factory=dict)
    """sft/dpo/grpo top-level fields, written after id/text/meta/source."""
    shape: str | None = None
    """An HTML page's shape (html_text.page_shape), counted in raw_records' metadata; not written."""


def _lines(value, what: str) -> str:
    """A body given as a string or a list of strings, as text (list items joined with newlines)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        try:
            return "\n".join(value)  # raises TypeError at the first item that is not a string
        except TypeError:
            pass
    raise Rejected("no_text_field", f"'{what}' is neither a string nor a list of strings")


def check_special(obj: dict) -> dict:
    """The sft/dpo/grpo top-level fields of obj, validated enough that tokenization can rely on them."""
    out = {}
    if "messages" in obj:
        m = obj["messages"]
        if not (
            isinstance(m, list)
            and m
            and all(
                isinstance(t, dict) and isinstance(t.get("role"), str) and isinstance(t.get("content"), str) for t in m
            )
        ):
            raise Rejected("bad_fields", "'messages' must be a non-empty list of {role: str, content: str}")
        out["messages"] = m
    if all(k in obj for k in DPO_KEYS):
        if not all(isinstance(obj[k], str) for k in DPO_KEYS):
            raise Rejected("bad_fields", "'prompt', 'chosen', 'rejected' must be strings")
        out.update((k, obj[k]) for k in DPO_KEYS)
    if all(k in obj for k in GRPO_KEYS):
        p, resp, rew = obj["prompt"], obj["responses"], obj["rewards"]
        if not (
            isinstance(p, str)
            and isinstance(resp, list)
            and resp
            and all(isinstance(r, str) for r in resp)
            and isinstance(rew, list)
            and len(rew) == len(resp)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rew)
        ):
            raise Rejected(
                "bad_fields",
                "'prompt' must be a string, 'responses' a non-empty list of strings, "
                "'rewards' a list of numbers of the same length",
            )
        out.update((k, obj[k]) for k in GRPO_KEYS)
    return out


def render_special(special: dict) -> str:
    """A plain-text view of sft/dpo/grpo fields, so cleaning and dedup have text to look at."""
    if "messages" in special:
        return "\n\n".join(f"{t['role']}: {t['content']}" for t in special["messages"])
    if "chosen" in special:  # the preferred answer stands for the record; `rejected` is kept, not rendered
        return f"{special['prompt']}\n\n{special['chosen']}"
    return special["prompt"] + "".join(f"\n\n{r}" for r in special["responses"])


def _map_poetry(obj: dict, special: dict, used: set) -> Mapped:
    """The chinese-poetry layout: body lines under a BODY_KEYS key, title (or ci tune) and author into meta."""
    key = next(filter(obj.__contains__, BODY_KEYS))
    text = _lines(obj[key], key)
    used.add(key)
    meta = {}
    for tkey in TITLE_KEYS:
        if tkey in obj:
            meta["title"] = obj[tkey]
            used.add(tkey)
            if tkey != "title":
                meta["title_field"] = tkey  # e.g. "rhythmic": the ci tune name stands as the title
            break
    if "author" in obj:
        meta["author"] = obj["author"]
        used.add("author")
    if len(used) < len(obj):  # fields beyond body, title and author (every used key is one of obj's)
        meta.update((k, v) for k, v in obj.items() if k not in used)
    return Mapped(text=text, meta=meta, special=special)


def map_record(obj: dict, settings: RawSettings) -> Mapped:
    """Text, meta and special fields of one input object, or raises Rejected."""
    special = check_special(obj) if ("messages" in obj or "prompt" in obj) else {}
    used = set(special)
    tf = settings.text_field
    if tf in obj:
        text = obj[tf]
        if not isinstance(text, str):
            raise Rejected("no_text_field", f"field '{tf}' is {type(text).__name__}, not a string")
        used.add(tf)
    elif settings.presets and not obj.keys().isdisjoint(BODY_KEYS):
        return _map_poetry(obj, special, used)
    elif special and settings.presets:
        text = render_special(special)
    else:
        raise Rejected("no_text_field", f"no '{tf}' field" + (" and no known layout" if settings.presets else ""))
    meta = {k: v for k, v in obj.items() if k not in used and k != "metadata"}
    nested = obj.get("metadata")
    if isinstance(nested, dict):  # dolma / common-crawl layout: flatten the nested metadata
        for k, v in nested.items():
            meta[k if k not in meta else f"metadata.{k}"] = v
    elif "metadata" in obj and "metadata" not in used:
        meta["metadata"] = nested
    return Mapped(text=text, meta=meta, special=special)
