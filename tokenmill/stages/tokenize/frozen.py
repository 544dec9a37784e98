"""The frozen tokenizer: trained once, then reused by every later batch until a retrain is asked for."""

from __future__ import annotations

from pathlib import Path

from tokenmill.common.io import STATS_FILE
from tokenmill.common.results import read_result
from tokenmill.errors import ConfigError
from tokenmill.stages.tokenize.settings import TokenizerSettings
from tokenmill.stages.tokenize.stage import TokenizerResult
from tokenmill_loader.format import TOKENIZER_FILE

NOT_COMPARED = {"retrain"}  # an action, not a property of the tokenizer


def frozen_tokenizer(tokenizer_dir: Path, settings: TokenizerSettings) -> TokenizerResult | None:
    """The result of the tokenizer already in `tokenizer_dir`, to be reused as it is; None when there is none or
    `settings.retrain` asks for a new one. Settings that differ from the ones it was trained with are refused
    (ConfigError naming them): a silent reuse would ignore them, a silent retrain would re-encode everything."""
    tokenizer_dir = Path(tokenizer_dir)
    if settings.retrain or not (tokenizer_dir / TOKENIZER_FILE).exists() or not (tokenizer_dir / STATS_FILE).exists():
        return None
    result = read_result(tokenizer_dir, TokenizerResult)
    trained = result.settings
    wanted = settings.model_dump()
    changed = sorted(k for k in wanted if k not in NOT_COMPARED and k in trained and trained[k] != wanted[k])
    if changed:
        shown = ", ".join(f"{k}: {trained[k]!r} -> {wanted[k]!r}" for k in changed)
        raise ConfigError(
            f"tokenizer: the frozen tokenizer in {tokenizer_dir} was trained with other settings ({shown}); set "
            "tokenizer.retrain: true to train a new one (every batch is re-encoded as a new dataset generation), "
            "or keep its settings"
        )
    return result
