"""fastText: training a two-class supervised model on prepared texts, and scoring with one (the positive class's
probability). fastText reads one example per line and treats a newline as the end of it, so every text's newlines
become spaces, in training and in scoring alike."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tokenmill.stages.quality_model.settings import QualityTrainSettings

POSITIVE = "__label__positive"
NEGATIVE = "__label__negative"


def one_line(text: str) -> str:
    return text.replace("\n", " ")


def train_fasttext(texts: Sequence[str], positive: Sequence[bool], path: Path, settings: QualityTrainSettings) -> None:
    """Trains on `texts` (labelled by `positive`, in the order given) and saves the model at `path`. One thread: with
    more, fastText's lock-free updates race and the model changes from run to run."""
    import fasttext

    examples = path.with_name(f".{path.name}.train.txt")
    try:
        with open(examples, "w", encoding="utf-8") as f:
            for text, is_positive in zip(texts, positive):
                f.write(f"{POSITIVE if is_positive else NEGATIVE} {one_line(text)}\n")
        model = fasttext.train_supervised(
            input=str(examples),
            wordNgrams=settings.word_ngrams,
            dim=settings.dim,
            epoch=settings.epoch,
            lr=settings.lr,
            minCount=settings.min_count,
            bucket=settings.bucket,
            seed=settings.seed,
            thread=1,
            verbose=0,
        )
    finally:
        examples.unlink(missing_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    model.save_model(str(tmp))
    os.replace(tmp, path)


class FastTextScorer:
    """A fastText model's positive-class probability per text, on the CPU. Its words are whitespace-separated:
    `max_tokens` keeps a text's first that many words."""

    def __init__(self, path: Path, max_tokens: int):
        from fasttext.FastText import _FastText

        self.max_tokens = max_tokens
        # _FastText, not fasttext.load_model, which warns on stderr that its return type changed; the C++ model
        # (.f) is what scoring calls
        model = _FastText(model_path=str(path))
        self._model = model.f
        labels = model.get_labels()
        if set(labels) == {POSITIVE, NEGATIVE}:
            self.positive = POSITIVE
        elif len(labels) == 2:  # a model trained elsewhere: the label sorted last ("__label__hq" > "__label__cc")
            self.positive = sorted(labels)[-1]
        else:
            raise ValueError(f"{path}: a quality model has two labels, this one has {len(labels)}: {labels[:5]}")

    def score(self, texts: Sequence[str]) -> np.ndarray:
        # the C++ predict of one line: the Python wrapper's predict builds np.array(copy=False), which numpy 2
        # refuses, and multilinePredict returns wrong probabilities under numpy 2 (both labels the top one's)
        predict, positive, limit = self._model.predict, self.positive, self.max_tokens
        out = np.zeros(len(texts), dtype=np.float32)
        for i, text in enumerate(texts):
            if not text or text.isspace():  # no words: fastText would score its end-of-line token alone
                continue
            line = one_line(text)
            if len(text) > 2 * limit:  # a shorter text has at most `limit` words
                words = text.split(None, limit)
                if len(words) > limit:
                    line = " ".join(words[:limit])
            for probability, label in predict(line + "\n", 2, 0.0, "replace"):
                if label == positive:
                    out[i] = probability
        return out
