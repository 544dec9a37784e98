"""cleaned_jsonl's record filters: each rule rejects with its reason and evidence, genuine text survives."""

import random

from support import JUEJU, POEM, PROSE, clean

from tokenmill.common.io import (
    REJECTED_FILE,
)
from tokenmill.common.samples import SAMPLE_CHARS, SAMPLES_PER_REASON
from tokenmill.stages.clean import REASONS, CleanSettings
from tokenmill.stages.clean import filters as F


def test_each_filter_rejects_with_its_reason(tmp_path):
    spam = "\n".join(["Buy cheap watches now!"] * 12)
    texts = [
        "",
        "   \n\t \u3000 ",
        "Hi there",
        "\ufffd\ufffd\ufffd ab\ufffd \u25a1\u25a1\u25a1\u25a1 ?? text \ue000\ue001",
        spam,
        "哈" * 200,
        "a" * 2000,
        JUEJU,
        POEM,
        PROSE,
    ]
    ids, recs, rej, stats = clean(tmp_path, texts, max_chars=1000)
    want = {
        0: "empty",
        1: "empty",
        2: "too_short",
        3: "placeholder_glyphs",
        4: "repetition",
        5: "repetition",
        6: "too_long",
    }
    assert {i: rej[ids[i]]["reason"] for i in want} == want
    assert set(recs) == {ids[7], ids[8], ids[9]}  # a 20-character jueju is valid
    for r in rej.values():  # every drop of these few is among its reason's first: each keeps its text
        assert set(r) == {"id", "source", "reason", "detail", "text", "text_chars"} and r["detail"]
    assert rej[ids[4]]["text"].startswith("Buy cheap watches now!\n") and rej[ids[6]]["text_chars"] == 2000
    assert len(rej[ids[6]]["text"]) == SAMPLE_CHARS + 1  # cut, with an ellipsis
    assert "'Buy cheap watches now!' x 12" in rej[ids[4]]["detail"]  # the rule's evidence
    assert "'哈哈' x 199" in rej[ids[5]]["detail"] and "'\ufffd'" in rej[ids[3]]["detail"]
    assert stats.rejected_by_reason == {
        "empty": 2,
        "too_short": 1,
        "placeholder_glyphs": 1,
        "repetition": 2,
        "too_long": 1,
    }
    assert all(r in stats.dropped for r in REASONS)


def test_rejected_file_and_stats_keep_a_bounded_sample_per_reason_with_text(tmp_path):
    """The first SAMPLES_PER_REASON drops of each reason in the batch (shard order) keep their text in
    _rejected.jsonl and in the stats; the others are one short line each; the same for any worker count."""
    short = [f"tiny {i}" for i in range(25)]
    spam = ["\n".join([f"Spam line {i}"] * 8) for i in range(3)]
    texts = short[:12] + spam + short[12:] + [PROSE]
    ids, _, rej, stats = clean(tmp_path, texts, per_shard=7)
    _, _, _, stats2 = clean(tmp_path, texts, per_shard=7, workers=2, name="w2")
    assert (tmp_path / "out" / REJECTED_FILE).read_bytes() == (tmp_path / "w2" / REJECTED_FILE).read_bytes()
    assert stats2.rejected_samples == stats.rejected_samples
    order = [rid for rid in ids if rid in rej]
    with_text = [rid for rid in order if "text" in rej[rid]]
    too_short = [rid for rid in order if rej[rid]["reason"] == "too_short"]
    assert with_text == [rid for rid in order if rid in too_short[:SAMPLES_PER_REASON] or rid not in too_short]
    samples = stats.rejected_samples
    assert set(samples) == {"too_short", "repetition"} and len(samples["repetition"]) == 3
    assert samples["too_short"] == [rej[rid] for rid in too_short[:SAMPLES_PER_REASON]]
    assert samples["too_short"][0]["text"] == "tiny 0" and samples["too_short"][0]["text_chars"] == 6
    assert "'Spam line 1' x 8" in samples["repetition"][1]["detail"]


def test_filters_keep_genuine_poetry_with_refrains():
    shijing = (
        "采采芣苡，薄言采之。采采芣苡，薄言有之。\n采采芣苡，薄言掇之。采采芣苡，薄言捋之。\n"
        "采采芣苡，薄言袺之。采采芣苡，薄言襭之。"
    )
    refrain = "式微式微，胡不归？\n微君之故，胡为乎中露！\n式微式微，胡不归？\n微君之躬，胡为乎泥中！"
    limits = CleanSettings().ngram_limits()
    for text in (shijing, refrain, JUEJU, POEM, PROSE):
        assert F.check_repetition(text, 0.4, 0.4, limits) is None, text
    assert F.check_repetition("好好学习 " * 50, 0.4, 0.4, limits)[0] == "repetition"
    assert F.check_placeholder_glyphs("床前明月光，疑是地上□。\n举头望明月，低头思故乡。", 0.1) is None  # one lost char
    assert F.check_placeholder_glyphs("床前□□□，□□□□□。", 0.1)[0] == "placeholder_glyphs"
    assert F.check_placeholder_glyphs("What? Really? Yes.", 0.1) is None
    assert F.check_placeholder_glyphs("Th? qu?ck br?wn f?x j?mps", 0.1)[0] == "placeholder_glyphs"


def test_huge_text_without_length_guard(tmp_path):
    words = [f"w{i}" for i in range(5000)]
    rng = random.Random(1)
    huge = "\n".join(" ".join(rng.choice(words) for _ in range(20)) for _ in range(90_000))  # ~10.4 MB
    assert len(huge) > 10_000_000
    ids, recs, rej, _ = clean(tmp_path, [huge, PROSE], max_chars=0)
    assert recs[ids[0]]["text"] == huge
