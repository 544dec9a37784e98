"""What the asset pages show (assets/metadata.py): drops with their text, the funnel inline, tables that fit.

The Dagster UI (1.13) shows a markdown entry inline only under 1,000 characters, a Dagster table always inline
as plain text, and plots every numeric entry across materializations (the Plots view).
"""

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import dagster as dg

from assets.metadata import (
    cell,
    cleaned_jsonl_metadata,
    deduped_jsonl_metadata,
    drop_samples_table,
    funnel_metadata,
    tokenizer_metadata,
)
from definitions import ASSETS
from tokenmill.stages.clean import CleanResult
from tokenmill.stages.dedup import DedupApplyResult
from tokenmill.stages.funnel_chart import funnel_svg
from tokenmill.stages.telemetry import BatchCounts, Funnel, LanguageCounts, StageCounts, TokenCounts, history_row
from tokenmill.stages.tokenize import TokenizerResult

UI_INLINE_MD_CHARS = 1000  # Dagster's MetadataEntry: `entry.mdStr.length < 1000` renders inline


def table_rows(value: dg.MetadataValue) -> list[dict]:
    assert isinstance(value, dg.TableMetadataValue), type(value)
    return [dict(r.data) for r in value.records]


def stage(key, label, docs_in, docs_out, dropped):
    return StageCounts(stage=key, label=label, docs_in=docs_in, docs_out=docs_out, dropped=dropped, linked=True)


FUNNEL = Funnel(
    source="demo",
    generation=1,
    stages=(
        stage("raw_records", "raw records", 2864, 2851, {f"reason_{i}": 1 for i in range(13)}),
        stage("cleaned_jsonl", "after cleaning", 2851, 2801, {"too_short": 12, "repetition": 38}),
        stage("deduped_jsonl", "after dedup", 2801, 2700, {"exact_duplicate": 55, "near_duplicate": 46}),
        stage("tokenized_bins", "tokenized", 2700, 2700, {}),
    ),
    batches=(BatchCounts(batch="g1-b000001", stages=(), tokens=0),),
    tokens=TokenCounts(total=1000, supervised=900, masked=100, isolated_punctuation_share=0.01),
    split={"train": {"tokens": 950, "records": 2600}, "val": {"tokens": 50, "records": 100}},
    records_with_metadata=None,
    metadata_dropout=None,
    bytes_on_disk={},
)


def test_funnel_shows_inline_with_input_and_output_counts_apart(tmp_path):
    meta = funnel_metadata(FUNNEL, history_row(FUNNEL), tmp_path)
    for key in ("funnel", "token_counts"):  # markdown short enough to show inline, never behind "Show Markdown"
        assert isinstance(meta[key], dg.MarkdownMetadataValue) and len(meta[key].value) < UI_INLINE_MD_CHARS, key
    funnel = meta["funnel"].value
    for label in ("input records", "raw records", "after cleaning", "after dedup", "tokenized"):
        assert re.search(rf"\| {label} \| [\d,]+ \| [\d.]+% \| █+[▏▎▍▌▋▊▉]? \|", funnel), label
    assert "chart" not in meta  # no funnel.svg in tmp_path: nothing to embed
    dropped = table_rows(meta["dropped"])  # any number of reasons, always inline
    assert len(dropped) == 13 + 2 + 2 and {"stage": "after dedup", "reason": "near_duplicate", "records": 46} in dropped
    # numeric entries: the Plots view draws each across materializations; the input is not named after a stage
    assert meta["input_records"] == 2864 and meta["records_raw_records"] == 2851
    assert "raw_records" not in meta
    (batch,) = table_rows(meta["batches"])  # short column names: the table fits the page
    assert set(batch) == {"batch", "input", "raw", "cleaned", "deduped", "tokenized", "tokens"}


def test_history_chart_keeps_a_row_equal_to_the_next_visible():
    """tokenized == after dedup in every run: the earlier row is drawn larger, under, in another shape."""
    svg = ET.fromstring(funnel_svg(FUNNEL, [history_row(FUNNEL)] * 3))
    rows = [g.attrib for g in svg.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "row"]
    assert [r["data-label"] for r in rows] == ["input", "raw records", "after cleaning", "after dedup", "tokenized"]
    dedup, tokenized = rows[3], rows[4]
    assert dedup["data-values"] == tokenized["data-values"]
    for under, over in zip(rows, rows[1:]):  # drawn in this order: a later row lies on top
        assert float(under["data-size"]) > float(over["data-size"]) and under["data-marker"] != over["data-marker"]


def test_funnel_chart_escapes_labels_and_draws_a_language_panel():
    languages = tuple(
        LanguageCounts(language=f"l{i}", records_cleaned=1, records_tokenized=1, tokens=10 + i, token_share=0.0)
        for i in range(15)
    )
    stages = (dataclasses.replace(FUNNEL.stages[0], label="raw <&> records"), *FUNNEL.stages[1:])
    svg = funnel_svg(dataclasses.replace(FUNNEL, stages=stages, languages=languages), [])
    root = ET.fromstring(svg)  # well-formed although a label holds markup characters
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "raw <&> records" in texts and "other (3)" in texts and root.get("width") == "1200"


def clean_result(**changes) -> CleanResult:
    result = CleanResult(
        docs_in=10,
        docs_out=8,
        dropped={"too_short": 2},
        seconds=0.1,
        rejected=2,
        rejected_by_reason={"too_short": 2},
        dropped_by_language={},
        quality_profile={"why": "set to 'curated'"},
        c4_lines_removed={},
        mojibake_repaired=0,
        surrogates_removed=0,
        control_chars_removed=0,
        docs_meta_extracted=0,
        meta_lines_extracted=0,
        docs_pii_masked=0,
        pii={},
        chars_in=100,
        chars_out=80,
        boilerplate={
            "lines_stripped": 3,
            "docs_touched": 3,
            "top_lines": [
                {"line": "Home | About | Contact " * 5, "count": 3, "score": 0.9, "df": 3, "position": 1.0}
                | {"template": 0.8, "short": 1.0}
            ],
        },
        flagged_contamination=0,
        decontamination={"mode": "drop", "files": []},
        examples=[{"id": "a", "kind": "repair", "before": "x\ny", "after": "x y", "meta": {}}],
        length_buckets=["0-9"],
        length_hist_before=[10],
        length_hist_after=[8],
        rejected_samples={
            "too_short": [
                {
                    "id": f"r{i}",
                    "source": {"path": "a.jsonl", "line": i},
                    "reason": "too_short",
                    "detail": "2 chars < min_chars 20",
                    "text": f"hi\n{i}",
                    "text_chars": 4,
                }
                for i in range(8)
            ]
        },
        shards=1,
        settings={},
        pass_seconds={},
        workers=1,
        rule_seconds={},
        rule_time_share={},
    )
    return dataclasses.replace(result, **changes)


def test_boilerplate_table_is_plain_text_that_fits():
    meta = cleaned_jsonl_metadata(clean_result(), Path("/tmp/cleaned"))
    (row,) = table_rows(meta["boilerplate_top_lines"])
    assert set(row) == {"line", "stripped", "score", "in docs"}  # four columns: none pushed off the page
    assert row["line"].startswith("Home | About | Contact") and "\\|" not in row["line"]
    assert len(row["line"]) <= 61


def test_drop_samples_show_text_and_evidence_per_reason():
    meta = cleaned_jsonl_metadata(clean_result(), Path("/tmp/cleaned"))
    rows = table_rows(meta["rejected_samples"])
    assert len(rows) == 5  # SAMPLES_SHOWN of the 8 kept in the stats
    # a curated filter states its value and threshold in its detail (the web rules: tests/test_quality.py)
    assert rows[1] == {"rule": "too_short", "value": "2 chars < min_chars 20", "threshold": "", "text": "hi / 1"}
    raw = drop_samples_table(
        {"malformed_json": [{"path": "b.jsonl", "line": 3, "detail": "Expecting value", "snippet": '{"text": "cut'}]},
        "snippet",
    )
    # two columns, where and why (the rule's evidence), then the text: it keeps its place on a 1600 px window
    assert table_rows(raw) == [
        {"record and reason": "b.jsonl:3 malformed_json: Expecting value", "text": '{"text": "cut'}
    ]


def test_removed_duplicates_shown_next_to_the_kept_record():
    members = [
        {"role": "kept", "level": "", "similarity": 1.0, "text": "Seize him, AEdiles!"},
        {"role": "removed", "level": "near", "similarity": 0.8123, "text": "Seize him, AEdiles!!"},
    ]
    applied = DedupApplyResult(
        docs_in=2,
        docs_out=1,
        dropped={"near_duplicate": 1},
        seconds=0.1,
        shards=1,
        removed_samples=[{"members": members}],
    )
    meta = deduped_jsonl_metadata(applied, Path("/tmp/d"), "removed.jsonl")
    rows = table_rows(meta["removed_samples"])
    assert [r["record"] for r in rows] == ["cluster 1 kept", "cluster 1 removed: near 0.812"]
    text = "text (removed: diff from kept)"  # a removed record shows where its words differ from the kept one's
    assert [r[text] for r in rows] == ["Seize him, AEdiles!", "Seize him, [-AEdiles!-] {+AEdiles!!+}"]


def test_tokenizer_examples_keep_one_row_per_text():
    trained = TokenizerResult(
        docs_in=1,
        docs_out=1,
        dropped={},
        seconds=0.1,
        settings={},
        corpus_bytes=10,
        mode="trained",
        vocab_size=300,
        sample_records=1,
        sample_chars=10,
        held_out_records=1,
        held_out_chars=3,
        held_out_tokens=1,
        chars_per_token=3.0,
        special_tokens={"<s>": 0},
        tokenizer_sha256="0",
        sample_seconds=0.1,
        train_seconds=0.1,
        examples=[{"text": "床前明月光\n疑是地上霜", "tokens": 4, "pieces": ["床前", "\n", " the", "|"]}],
    )
    rows = table_rows(tokenizer_metadata(trained, Path("/tmp/tok"))["examples"])
    assert rows == [{"text": "床前明月光 / 疑是地上霜", "tokens": 4, "first tokens": "床前 · ↵ · ␣the · |"}]


def test_angle_brackets_survive_markdown():
    """The UI reads `<s>` in markdown as an HTML tag and drops it: cells escape it, descriptions quote it."""
    assert cell("<s> a | b </s>") == "&lt;s&gt; a \\| b &lt;/s&gt;"
    for asset in ASSETS:
        for key, spec in zip(asset.keys, asset.specs):
            outside_code = re.sub(r"`[^`]*`", "", spec.description or "")
            assert not re.search(r"<[^>\s]*>", outside_code), (key, outside_code)
