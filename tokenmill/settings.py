"""How a stage declares its settings: one pydantic class per stage, declared once.

Each field has a description, choices are ``Literal``, numbers carry bounds, and cross-field rules live in one
``model_validator`` (OLMo-core's ``validate()``). The plain stage function takes the class; the asset's Dagster
config subclasses it (``class DedupConfig(DedupSettings, dg.Config)``), so Dagster refuses a bad choice at launch
and :func:`validate_run_settings` refuses a bad bound or combination before any asset of the run materializes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError

from tokenmill.errors import ConfigError

_SETTINGS_BY_ASSET: dict[str, type[StageSettings]] = {}


class StageSettings(BaseModel):
    """Base of every stage's settings. Set ``asset_key`` to the asset whose run config these are."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    asset_key: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs):
        super().__pydantic_init_subclass__(**kwargs)
        if cls.__dict__.get("asset_key"):  # the stage's own class, not the Dagster config that subclasses it
            _SETTINGS_BY_ASSET[cls.asset_key] = cls

    def run_problems(self, run: dict[str, StageSettings]) -> list[str]:
        """Rules across the stages of one run config (asset key -> its settings), as ``<asset>.<field>: ...``."""
        return []


def _describe(asset_key: str, error: ValidationError) -> list[str]:
    problems = []
    for e in error.errors():
        field = ".".join(str(part) for part in e["loc"])
        where = f"{asset_key}.{field}" if field else asset_key
        problems.append(
            f"{where}: {e['msg'].removeprefix('Value error, ')} (got {e.get('input')!r})"
            if field
            else f"{where}: {e['msg'].removeprefix('Value error, ')}"
        )
    return problems


def load_settings(cls: type[StageSettings], values: dict) -> StageSettings:
    """``cls(**values)``, or a ConfigError naming each bad field as ``<asset>.<field>``."""
    try:
        return cls(**values)
    except ValidationError as e:
        raise ConfigError("invalid settings: " + "; ".join(_describe(cls.asset_key, e))) from None


Number = TypeVar("Number", int, float)


@overload
def number_from_env(name: str, default: float) -> float: ...
@overload
def number_from_env(name: str, default: Number, cast: Callable[[str], Number]) -> Number: ...
def number_from_env(name: str, default: float, cast: Callable[[str], float] = float) -> float:
    """A non-negative number from environment variable `name` (unset or empty: `default`), or a ConfigError
    naming the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = cast(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{name} must be a non-negative {cast.__name__}, got {raw!r}")
    return value


def validate_run_settings(run_config: Mapping[str, Any] | None) -> None:
    """Checks the settings of every stage named in a Dagster run config (``ops.<asset>.config``), all at once,
    so a run with a bad value fails before its first asset reads any data."""
    problems, built = [], {}
    for asset_key, op in ((run_config or {}).get("ops") or {}).items():
        cls = _SETTINGS_BY_ASSET.get(asset_key)
        if cls is None or not isinstance(op, dict):
            continue
        try:
            built[asset_key] = cls(**(op.get("config") or {}))
        except ValidationError as e:
            problems += _describe(asset_key, e)
    for settings in built.values():
        problems += settings.run_problems(built)
    if problems:
        raise ConfigError("invalid run config, nothing was run: " + "; ".join(problems))
