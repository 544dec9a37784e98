"""The stages of the graph, one declaration each, in graph order: the lists a stage is in (per batch, rebuilt on a
new generation, record stages and their funnel labels, explain's search order, the stage folders on disk) are
derived from here, and the wiring maps each entry to its asset (definitions.py `stage_assets`).

A stage's settings and result types are named as `module:Class` and loaded on demand (`settings_class`,
`result_class`): every layer imports this module (tokenmill.common.disk, tokenmill.explain, which
tokenmill.stages.dedup imports), so it imports no stage package; `registry_problems` loads them all when the code
location loads, so a renamed class fails there, not in a run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from tokenmill.common.results import StageResult
from tokenmill.errors import ConfigError
from tokenmill.settings import StageSettings


@dataclass(frozen=True, kw_only=True)
class Stage:
    key: str
    """Its Dagster asset key and its folder in the data root."""
    per_batch: bool = False
    """One output per source batch (`<key>/<batch>/`, a dynamic partition); retiring a batch removes it."""
    rebuilt: bool = False
    """`tokenmill update --rebuild` removes it, to be built again from the source as a new generation."""
    funnel_label: str | None = None
    """A record stage (it reports docs_in, docs_out, dropped_<reason>): its row in the funnel. None: not one."""
    settings: str | None = None
    """Its run config's StageSettings subclass, `module:Class` (None: it takes no config)."""
    result: str | None = None
    """The StageResult subclass it writes as `_stats.json`, `module:Class` (None: it writes none)."""

    def settings_class(self) -> type[StageSettings] | None:
        return _load(self.settings) if self.settings else None

    def result_class(self) -> type[StageResult] | None:
        return _load(self.result) if self.result else None


def _load(name: str) -> type:
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


RAW_RECORDS = Stage(
    key="raw_records",
    per_batch=True,
    rebuilt=True,
    funnel_label="raw records",
    settings="tokenmill.stages.raw:RawSettings",
    result="tokenmill.stages.raw:RawResult",
)
CLEANED_JSONL = Stage(
    key="cleaned_jsonl",
    per_batch=True,
    rebuilt=True,
    funnel_label="after cleaning",
    settings="tokenmill.stages.clean:CleanSettings",
    result="tokenmill.stages.clean:CleanResult",
)
DEDUP_REPORT = Stage(
    key="dedup_report",
    per_batch=True,
    rebuilt=True,
    settings="tokenmill.stages.dedup:DedupSettings",
    result="tokenmill.stages.dedup:DedupResult",
)
DEDUP_INDEX = Stage(key="dedup_index", per_batch=True, rebuilt=True)  # written by dedup_report's op, with its config
DEDUPED_JSONL = Stage(
    key="deduped_jsonl",
    per_batch=True,
    rebuilt=True,
    funnel_label="after dedup",
    result="tokenmill.stages.dedup:DedupApplyResult",
)
TOKENIZER = Stage(
    key="tokenizer",
    rebuilt=True,
    settings="tokenmill.stages.tokenize:TokenizerSettings",
    result="tokenmill.stages.tokenize:TokenizerResult",
)
# not rebuilt: its versions stay for running readers (a rebuild publishes a new generation over them)
TOKENIZED_BINS = Stage(
    key="tokenized_bins",
    funnel_label="tokenized",
    settings="tokenmill.stages.tokenize:ShardSettings",
    result="tokenmill.stages.tokenize:TokenizeResult",
)
FUNNEL_TELEMETRY = Stage(key="funnel_telemetry")  # not rebuilt: the funnel keeps its history

STAGES = (
    RAW_RECORDS,
    CLEANED_JSONL,
    DEDUP_REPORT,
    DEDUP_INDEX,
    DEDUPED_JSONL,
    TOKENIZER,
    TOKENIZED_BINS,
    FUNNEL_TELEMETRY,
)


# Each list is derived when asked for, from STAGES as it is then.
def stage_keys() -> tuple[str, ...]:
    """Every stage, in graph order: the stages of `tokenmill update`."""
    return tuple(s.key for s in STAGES)


def per_batch_keys() -> tuple[str, ...]:
    return tuple(s.key for s in STAGES if s.per_batch)


def rebuilt_keys() -> tuple[str, ...]:
    return tuple(s.key for s in STAGES if s.rebuilt)


def record_stages() -> tuple[tuple[str, str], ...]:
    """(key, funnel label) of each record stage, in graph order."""
    return tuple((s.key, s.funnel_label) for s in STAGES if s.funnel_label is not None)


def kept_search_order() -> tuple[str, ...]:
    """The per-batch record stages, last first: where `tokenmill explain` looks for a record no stage dropped."""
    return tuple(s.key for s in reversed(STAGES) if s.per_batch and s.funnel_label is not None)


def registry_problems() -> list[str]:
    """What is wrong with STAGES: a key declared twice, a settings or result type that does not load, is not a
    StageSettings or StageResult subclass, or (settings) names another asset."""
    keys = stage_keys()
    problems = [f"{key}: declared twice" for key in sorted({k for k in keys if keys.count(k) > 1})]
    for stage in STAGES:
        for name, base in ((stage.settings, StageSettings), (stage.result, StageResult)):
            if name is None:
                continue
            try:
                loaded = _load(name)
            except (ImportError, AttributeError) as e:
                problems.append(f"{stage.key}: {name} does not load ({e})")
                continue
            if not (isinstance(loaded, type) and issubclass(loaded, base)):
                problems.append(f"{stage.key}: {name} is not a {base.__name__} subclass")
            elif (owner := getattr(loaded, "asset_key", stage.key)) != stage.key:  # a result names no asset
                problems.append(f"{stage.key}: {name} is the settings of {owner!r}")
    return problems


def check_registry() -> None:
    """Raises ConfigError naming every problem of STAGES (`registry_problems`)."""
    if problems := registry_problems():
        raise ConfigError("stage registry: " + "; ".join(problems))
