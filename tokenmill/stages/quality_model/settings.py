"""The training settings of a fastText quality classifier and the card (model.json) written beside the model."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenmill.errors import ConfigError

CARD_FILE = "model.json"
FASTTEXT_FILE = "model.bin"
CARD_FORMAT_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class QualityTrainSettings:
    """fastText supervised training, DCLM's recipe by default. DCLM's baselines/README.md trains its OH-2.5 + ELI5
    classifier with `train_fasttext_classifier.py --wordNgrams 2` and says it "did not deviate from [the] default
    values" of its other hyperparameters, which baselines/train_fasttext_classifier.py sets to lr 0.1, dim 100,
    ws 5, epoch 5, minCount 1, seed 42 (mlfoundations/dclm). The classes are balanced: the larger one's training
    share is subsampled (seeded) to the smaller one's size, as DCLM trains on equal numbers of each."""

    word_ngrams: int = 2
    """Longest word n-gram used as a feature (2: unigrams and bigrams)."""
    dim: int = 100
    """Size of the word vectors."""
    epoch: int = 5
    lr: float = 0.1
    min_count: int = 1
    """Occurrences a word needs to be in the vocabulary."""
    bucket: int = 2_000_000
    """Hash buckets of the n-gram features (fastText's default; the model holds bucket x dim floats: 800 MB at
    dim 100, so small tests pass fewer)."""
    seed: int = 42
    """Seeds the held-out split, the balancing and fastText itself; with one thread the model file is the same
    byte for byte for the same inputs."""
    held_out_share: float = 0.1
    """Share of each class kept out of training for the metrics."""
    min_examples: int = 10
    """Texts each class needs at least (10: one held out at the default share)."""
    histogram_bins: int = 10

    def validate(self) -> None:
        """Raises ConfigError naming the first field out of range."""
        for name in ("word_ngrams", "dim", "epoch", "min_count", "bucket", "histogram_bins"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train-quality: {name} must be at least 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ConfigError(f"train-quality: lr must be above 0, got {self.lr}")
        if not 0 < self.held_out_share < 1:
            raise ConfigError(f"train-quality: held_out_share must be between 0 and 1, got {self.held_out_share}")
        if self.min_examples < 2:
            raise ConfigError(f"train-quality: min_examples must be at least 2, got {self.min_examples}")


@dataclass(frozen=True, kw_only=True)
class QualityModelCard:
    """What model.json says about a trained model: where it came from, how it was trained and how it scores."""

    model_file: str
    """The model's file name in its folder."""
    model_id: str
    inputs: dict
    """"positive" and "negative": each a list of {path, sha256, bytes, texts}."""
    parameters: dict
    examples: dict
    """Texts per class: read, trained on (after balancing) and held out."""
    metrics: dict
    """On the held-out share: roc_auc, threshold (the one of best F1), precision, recall, histogram."""
    tokenmill_version: str
    format_version: int = CARD_FORMAT_VERSION
    kind: str = "fasttext"

    def write(self, folder: Path) -> Path:
        path = folder / CARD_FILE
        tmp = path.with_name(f".{CARD_FILE}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, folder: Path) -> QualityModelCard:
        return cls(**json.loads((folder / CARD_FILE).read_text(encoding="utf-8")))
