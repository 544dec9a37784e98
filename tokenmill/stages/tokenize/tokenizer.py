"""The tokenizer file: loading it, its special-token ids, and pinning the one a run started from.

A tokenize run reads `tokenizer.json` once and records its SHA-256 (a `TokenizerPin`); every task loads the file
through the pin and refuses it if the bytes changed since, so a dataset is never encoded with two tokenizers
(a tokenizer materialized while tokenized_bins runs used to leave part of the records encoded with the other).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from tokenmill.errors import ConfigError, CorruptOutputError, StaleUpstreamError
from tokenmill_loader.format import SPECIAL_TOKENS, TOKENIZER_FILE


def hash64(*parts: str) -> int:
    """A stable 64-bit hash of strings (blake2b), the basis of every sampling/split/dropout decision."""
    return int.from_bytes(hashlib.blake2b("\0".join(parts).encode("utf-8"), digest_size=8).digest(), "little")


def tokenizer_file(path: str | os.PathLike) -> Path:
    """A tokenizer.json, or the tokenizer.json inside a folder."""
    p = Path(path).expanduser()
    return p / TOKENIZER_FILE if p.is_dir() else p


def _parse(text: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def load_tokenizer(path: str | os.PathLike):
    """A tokenizers.Tokenizer from a tokenizer.json the user named (or a folder holding one)."""
    p = tokenizer_file(path)
    if not p.is_file():
        raise ConfigError(f"tokenizer file not found: {p}")
    try:
        return _parse(p.read_text(encoding="utf-8"))
    except Exception as e:  # the Rust error says what is wrong with the JSON
        raise ConfigError(f"{p}: not a loadable tokenizers tokenizer.json ({e})") from e


def special_token_ids(tok, where: str | os.PathLike = "tokenizer") -> dict[str, int]:
    """Our special tokens -> id (every one must exist)."""
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise StaleUpstreamError(
            f"{where}: tokenizer lacks special tokens {missing} (build it with the tokenizer asset)"
        )
    return ids


@dataclass(frozen=True, kw_only=True)
class TokenizerPin:
    """The upstream tokenizer.json a run started from: its path and the SHA-256 of its bytes then."""

    path: str
    sha256: str


def pin_tokenizer(path: str | os.PathLike) -> tuple[TokenizerPin, bytes]:
    """Reads the upstream tokenizer.json once: its pin, and the bytes (copied next to the shards)."""
    p = tokenizer_file(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise StaleUpstreamError(f"{p}: missing; materialize the tokenizer asset first") from None
    return TokenizerPin(path=str(p), sha256=hashlib.sha256(data).hexdigest()), data


def read_pinned(pin: TokenizerPin) -> bytes:
    """The bytes of a pinned tokenizer.json, refused if they are not the ones the run started from."""
    data = Path(pin.path).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != pin.sha256:
        raise StaleUpstreamError(
            f"{pin.path}: changed during the run (sha256 {digest[:12]}…, the run started "
            f"from {pin.sha256[:12]}…); rerun once the tokenizer is settled"
        )
    return data


def parse_pinned(pin: TokenizerPin, data: bytes):
    """The tokenizer of a pin's bytes (from read_pinned)."""
    try:
        return _parse(data.decode("utf-8"))
    except Exception as e:
        raise CorruptOutputError(f"{pin.path}: not a loadable tokenizer.json ({e})") from e
