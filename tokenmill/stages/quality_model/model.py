"""Loading a quality model from disk: a fastText .bin, a folder `tokenmill train-quality` wrote (model.json beside
model.bin) or a transformers sequence-classification folder (config.json). Nothing is fetched from a hub."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from tokenmill.common.cache import cache_folder
from tokenmill.common.io import atomic_file
from tokenmill.errors import ConfigError
from tokenmill.stages.quality_model.settings import CARD_FILE, QualityModelCard

DEVICES = ("auto", "cpu", "cuda")
ID_MEMO_FOLDER = "quality-model-ids"
HASH_CHUNK = 1 << 20


class Scorer(Protocol):
    def score(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True, kw_only=True)
class QualityModel:
    """A loaded quality model: `score(texts)` gives one float32 per text, higher is better (fastText: the positive
    class's probability; transformers: the regression value or class 1's probability)."""

    path: Path
    kind: Literal["fasttext", "transformers"]
    model_id: str
    """sha256 of the files that make its scores, first 16 hex digits."""
    max_tokens: int
    scorer: Scorer

    def score(self, texts: Sequence[str]) -> np.ndarray:
        return self.scorer.score(texts)


def model_files(path: Path) -> list[Path]:
    """The files a model's scores depend on: the .bin, or every file of a transformers folder (weights, config,
    tokenizer) but hidden ones. A train-quality folder's card holds metrics only, so its id is its model's."""
    if path.is_file():
        return [path]
    if (path / CARD_FILE).is_file():
        return [path / QualityModelCard.read(path).model_file]
    return sorted(p for p in path.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts))


def model_id(path: str | Path) -> str:
    """sha256 over each model file's relative name and bytes, first 16 hex digits. Remembered in tokenmill's cache
    folder under the files' stat (size, mtime, ctime, inode, device; as git's index spares re-hashing a file): any
    write or replacement changes the ctime or the inode, so only an untouched model skips the hashing, 0.7 CPU-s
    per batch for DCLM's 826 MB model."""
    path = Path(path)
    files = model_files(path)
    stamp = json.dumps([file_stamp(f) for f in files]).encode()
    memo = cache_folder() / ID_MEMO_FOLDER / f"{hashlib.sha256(stamp).hexdigest()[:32]}.txt"
    try:
        known = memo.read_text().strip()
        if len(known) == 16 and all(c in "0123456789abcdef" for c in known):
            return known
    except OSError:
        pass
    identity = hashed_model_id(path, files)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(memo) as out:
            out.write(identity)
    except OSError:  # no usable cache folder: hashed again next time
        pass
    return identity


def file_stamp(file: Path) -> list:
    st = file.stat()
    return [str(file.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def hashed_model_id(path: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() if path.is_file() else file.relative_to(path).as_posix().encode())
        digest.update(b"\0")
        with open(file, "rb") as f:
            while chunk := f.read(HASH_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def model_kind(path: str | Path) -> Literal["fasttext", "transformers"]:
    """What kind of model `path` holds, by its files (nothing is loaded); ConfigError when neither."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"quality_model: no such file or folder: {path}")
    if path.is_file() or (path / CARD_FILE).is_file():
        return "fasttext"
    if (path / "config.json").is_file():
        return "transformers"
    raise ConfigError(
        f"quality_model: {path} is neither a fastText .bin, a train-quality folder ({CARD_FILE}) nor a "
        "transformers folder (config.json)"
    )


def load_quality_model(
    path: str | Path,
    device: str = "auto",
    max_tokens: int = 512,
    *,
    known_id: str | None = None,
    linear_cache: Path | None = None,
) -> QualityModel:
    """The model at `path`; `device` auto picks CUDA when torch sees one (transformers only: fastText runs on the
    CPU); texts are cut to `max_tokens` tokens (fastText: whitespace-separated words). `known_id`: its model_id as
    the caller computed it (not hashed again); `linear_cache`: where a fastText model's linear form is kept, a file
    the caller names by that id (FastTextScorer)."""
    path = Path(path)
    if device not in DEVICES:
        raise ConfigError(f"quality_model.device: one of {', '.join(DEVICES)}, got {device!r}")
    if max_tokens < 1:
        raise ConfigError(f"quality_model.max_tokens: must be at least 1, got {max_tokens}")
    scorer: Scorer
    kind = model_kind(path)
    if kind == "fasttext":
        from tokenmill.stages.quality_model.fasttext_model import FastTextScorer

        file = path if path.is_file() else path / QualityModelCard.read(path).model_file
        try:
            scorer = FastTextScorer(file, max_tokens, linear_cache=linear_cache)
        except ValueError as e:  # not a fastText model, or not one of two labels
            raise ConfigError(f"quality_model: {file} is not a two-label fastText model ({e})") from None
    else:
        from tokenmill.stages.quality_model.transformers_model import TransformersScorer

        scorer = TransformersScorer(path, device, max_tokens)
    identity = known_id or model_id(path)
    return QualityModel(path=path, kind=kind, model_id=identity, max_tokens=max_tokens, scorer=scorer)
