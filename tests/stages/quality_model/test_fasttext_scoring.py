"""The linear fastText scorer (fasttext_linear) gives the C++ predict's probabilities, and models it does not
cover fall back to predict line by line. Small models trained here."""

import random
import sys

import numpy as np
import pytest

from tokenmill.stages.quality_model import QualityTrainSettings, train_fasttext
from tokenmill.stages.quality_model.fasttext_linear import OTHER_SPACE_LEADS, LinearFastText
from tokenmill.stages.quality_model.fasttext_model import (
    NEGATIVE,
    POSITIVE,
    FastTextScorer,
    cached_linear_form,
    one_line,
)

# words of up to 8 bytes, longer ones (their lookup checks the token's bytes) and one past 32 bytes (a dict's)
WORDS = (
    "the cell membrane café naïve 東京 数据 🙂 buy cheap pills now click here free money </s>x transportation "
    "internationalization électroencéphalographie " + "pneumonoultramicroscopicsilicovolcanoconiosis"
).split()
PROBES = [
    "the cell membrane regulates transport",
    "zzz unknownword qqq",  # only unknown words
    "the café naïve 東京 数据 🙂🙂 ÿ",
    "cell\u00a0membrane\u3000東京 free\u2003money",  # Unicode spaces: not fastText separators
    "buy\tcheap\rpills\0now\x0bclick\x0chere\x1cfree",
    "line one\nline two\r\nthree",
    "cell " * 900 + "money",  # past max_tokens
    "\u00a0".join(["cell"] * 700),  # past max_tokens only as str.split() counts words
    "x" * 3000 + " the cell",  # a long token
    "buy cheap </s> the cell membrane",  # "</s>" inside a line ends it
    "cell </s> money </s> free",
    # long words, and tokens of their first bytes or of one byte more or less
    "transportation internationalization électroencéphalographie pneumonoultramicroscopicsilicovolcanoconiosis",
    "transportatio transportationn internationalizatiom pneumonoultramicroscopicsilicovolcan money",
    "pneumonoultramicroscopicsilicovolcanoconiosi pneumonoultramicroscopicsilicovolcanoconiosiss cell",
    "__label__positive cell __label__other money",
    "",
    "   \n\t",
    "\u3000",
]


def texts(rng: random.Random, count: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30))) for _ in range(count)]


@pytest.fixture(scope="module")
def training():
    rng = random.Random(0)
    return texts(rng, 400), [i % 2 == 0 for i in range(400)]


def model(tmp_path, training, **settings):
    path = tmp_path / "model.bin"
    train_fasttext(*training, path, QualityTrainSettings(bucket=5_000, dim=8, epoch=2, **settings))
    return path


@pytest.mark.parametrize("word_ngrams", [1, 2, 3])
def test_linear_scores_are_predicts(tmp_path, training, word_ngrams):
    path = model(tmp_path, training, word_ngrams=word_ngrams)
    fast, per_line = FastTextScorer(path, 512), FastTextScorer(path, 512, per_line=True)
    assert not fast.per_line and per_line.per_line
    batch = PROBES + texts(random.Random(1), 600)
    got, want = fast.score(batch), per_line.score(batch)
    assert np.abs(got - want).max() <= 1e-5
    assert got[PROBES.index("")] == 0 and got[PROBES.index("\u3000")] == 0


def test_short_max_tokens(tmp_path, training):
    path = model(tmp_path, training)
    batch = PROBES + texts(random.Random(2), 50)
    got, want = FastTextScorer(path, 5).score(batch), FastTextScorer(path, 5, per_line=True).score(batch)
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("options", [{"loss": "hs"}, {"maxn": 3, "minn": 2}])
def test_other_models_fall_back_to_predict(tmp_path, training, options):
    import fasttext

    lines = tmp_path / "train.txt"
    lines.write_text("".join(f"{POSITIVE if p else NEGATIVE} {one_line(t)}\n" for t, p in zip(*training)))
    path = tmp_path / "other.bin"
    fasttext.train_supervised(
        input=str(lines), bucket=5_000, dim=8, epoch=2, thread=1, verbose=0, **options
    ).save_model(str(path))
    scorer = FastTextScorer(path, 512)
    assert scorer.per_line
    scores = scorer.score(PROBES)
    assert scores[PROBES.index("")] == 0 and 0 < scores[0] <= 1 + 1e-5


def test_other_space_leads_cover_str_split():
    # every character str.split() splits on but fastText's readWord does not starts with one of these bytes
    fasttext_separators = set(" \t\n\v\f\r\0")
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() and chr(c) not in fasttext_separators]
    assert {c.encode()[0] for c in spaces} <= set(OTHER_SPACE_LEADS)


def test_a_cached_linear_form_scores_alike_without_loading_the_model(tmp_path, training, monkeypatch):
    """The first scorer writes the linear form; the next reads it and never opens the model (long words and all);
    an unreadable cache is built again."""
    import fasttext.FastText

    path, cache = model(tmp_path, training, word_ngrams=2), tmp_path / "cache" / "m.linear-v1.npz"
    batch = PROBES + texts(random.Random(3), 200)
    want = FastTextScorer(path, 512, linear_cache=cache).score(batch)
    assert cache.is_file() and cache.stat().st_size < path.stat().st_size
    real = fasttext.FastText._FastText

    def refused(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(fasttext.FastText, "_FastText", refused)
    cached = FastTextScorer(path, 512, linear_cache=cache)
    assert not cached.per_line and np.array_equal(cached.score(batch), want)
    monkeypatch.setattr(fasttext.FastText, "_FastText", real)
    cache.write_bytes(cache.read_bytes()[:100])
    assert np.array_equal(FastTextScorer(path, 512, linear_cache=cache).score(batch), want)
    assert np.array_equal(LinearFastText.load(cache).row_values, cached_linear_form(cache).row_values)  # rewritten
