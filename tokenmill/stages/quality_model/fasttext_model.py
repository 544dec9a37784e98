"""fastText: training a two-class supervised model on prepared texts, and scoring with one (the positive class's
probability). fastText reads one example per line and treats a newline as the end of it, so every text's newlines
become spaces, in training and in scoring alike."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_file
from tokenmill.stages.quality_model.fasttext_linear import LinearFastText, first_words, linear_fasttext
from tokenmill.stages.quality_model.settings import QualityTrainSettings

POSITIVE = "__label__positive"
NEGATIVE = "__label__negative"
# the linear form's arrays of a few hundred lines stay in the CPU caches (see docs/profile.md)
LINES_PER_CALL = 256


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
    `max_tokens` keeps a text's first that many words. A two-label softmax model of word features (tokenmill's, and
    DCLM's) scores a batch at once through its linear form (fasttext_linear), any other one line by line through the
    C++ predict; `per_line` forces the latter. With `linear_cache` (a file named by the model's id) the linear form
    is read from there when present and written there when built, so a process after the first never loads the
    model itself."""

    def __init__(self, path: Path, max_tokens: int, per_line: bool = False, linear_cache: Path | None = None):
        self.max_tokens = max_tokens
        linear = None if per_line or linear_cache is None else cached_linear_form(linear_cache)
        self._probabilities, self.per_line = (
            (linear.probabilities, False) if linear is not None else load_fasttext(path, per_line, linear_cache)
        )

    def score(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros(len(texts), dtype=np.float32)
        # a text with no words scores 0 (fastText would score its end-of-line token alone)
        scored = [i for i, text in enumerate(texts) if text and not text.isspace()]
        for start in range(0, len(scored), LINES_PER_CALL):
            part = scored[start : start + LINES_PER_CALL]
            out[part] = self._probabilities([one_line(texts[i]) for i in part], self.max_tokens)
        return out


def load_fasttext(
    path: Path, per_line: bool, linear_cache: Path | None
) -> tuple[Callable[[list[str], int], np.ndarray], bool]:
    """The model at `path` as its scoring function: its linear form's (saved to `linear_cache`), else predict line
    by line; and whether it is the latter."""
    from fasttext.FastText import _FastText

    # _FastText, not fasttext.load_model, which warns on stderr that its return type changed; the C++ model (.f) is
    # what scoring calls
    model = _FastText(model_path=str(path))
    labels = model.get_labels()
    if set(labels) == {POSITIVE, NEGATIVE}:
        positive = POSITIVE
    elif len(labels) == 2:  # a model trained elsewhere: the label sorted last ("__label__hq" > "__label__cc")
        positive = sorted(labels)[-1]
    else:
        raise ValueError(f"{path}: a quality model has two labels, this one has {len(labels)}: {labels[:5]}")
    linear = None if per_line else linear_fasttext(model.f, labels, positive)
    if linear is None:
        return partial(predict_lines, model.f, positive), True
    if linear_cache is not None:
        linear_cache.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(linear_cache, "wb") as out:
            linear.save(out)
    # the linear form holds all scoring needs, so the C++ model (bucket x dim floats) is freed with `model`
    return linear.probabilities, False


def cached_linear_form(path: Path) -> LinearFastText | None:
    """The linear form saved at `path`; None when there is none or it cannot be read (it is built again)."""
    try:
        return LinearFastText.load(path)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def predict_lines(model, positive: str, lines: list[str], max_tokens: int) -> np.ndarray:
    """`positive`'s probability per line cut to its first `max_tokens` words, from the C++ predict of `model`
    (fasttext_pybind's) one line at a time: the Python wrapper's predict builds np.array(copy=False), which numpy 2
    refuses, and multilinePredict returns wrong probabilities under numpy 2 (both labels the top one's)."""
    out = np.zeros(len(lines))
    for i, line in enumerate(lines):
        if len(line) > 2 * max_tokens:  # a shorter line has at most `max_tokens` words
            line = first_words(line, max_tokens) or line
        for probability, label in model.predict(line + "\n", 2, 0.0, "replace"):
            if label == positive:
                out[i] = probability
    return out
