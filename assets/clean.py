"""cleaned_jsonl: repaired, normalized records with metadata extracted, boilerplate stripped, garbage rejected."""

import dagster as dg
from pydantic import Field

from resources import DataRoot
from tokenmill.clean import REASONS, CleanSettings, clean_corpus
from tokenmill.common.io import staged_output

TOP_LINES = 15  # boilerplate lines shown in the UI table; _stats.json keeps 50
CELL_CHARS = 100


class CleanConfig(dg.Config):
    normalization: str = Field(default=CleanSettings.normalization,
                               description="Unicode normalization: NFC (keeps full-width CJK punctuation), NFKC or none")
    fix_mojibake: bool = Field(default=CleanSettings.fix_mojibake,
                               description="Repair mojibake and HTML entities with ftfy (no width/quote changes)")
    extract_metadata: bool = Field(default=CleanSettings.extract_metadata,
                                   description="Move Title:/Author:/作者：/朝代：/By ... header lines into meta")
    max_header_lines: int = Field(default=CleanSettings.max_header_lines,
                                  description="Lines at the top of a text that may be metadata headers")
    boilerplate: bool = Field(default=CleanSettings.boilerplate, description="Strip boilerplate lines (two-pass detector)")
    bp_min_df: int = Field(default=CleanSettings.bp_min_df,
                           description="Documents a line must occur in to be a boilerplate candidate")
    bp_threshold: float = Field(default=CleanSettings.bp_threshold,
                                description="Joint boilerplate score (df, position, template, short) from which a line is stripped")
    bp_edge_frac: float = Field(default=CleanSettings.bp_edge_frac,
                                description="Header/footer zone: first/last share of a document's lines (at least 1)")
    min_chars: int = Field(default=CleanSettings.min_chars, description="Reject texts with fewer non-space characters")
    max_chars: int = Field(default=CleanSettings.max_chars, description="Reject texts longer than this (0: no limit)")
    max_placeholder_ratio: float = Field(default=CleanSettings.max_placeholder_ratio,
                                         description="Reject above this share of placeholder glyphs (U+FFFD, □, private use, stray ?)")
    max_dup_line_frac: float = Field(default=CleanSettings.max_dup_line_frac,
                                     description="Reject above this share of repeated lines (4+ lines)")
    max_dup_line_char_frac: float = Field(default=CleanSettings.max_dup_line_char_frac,
                                          description="Reject above this share of characters in repeated lines")
    max_top_2gram_frac: float = Field(default=CleanSettings.max_top_2gram_frac,
                                      description="Reject when the top word/char 2-gram covers more characters than this")
    max_top_3gram_frac: float = Field(default=CleanSettings.max_top_3gram_frac, description="As above, 3-grams")
    max_top_4gram_frac: float = Field(default=CleanSettings.max_top_4gram_frac, description="As above, 4-grams")
    examples: int = Field(default=CleanSettings.examples, description="Before/after examples kept")


def _cell(text) -> str:
    text = str(text).replace("\n", " / ").replace("|", "\\|")
    return text if len(text) <= CELL_CHARS else text[:CELL_CHARS] + "…"


def _examples_md(examples: list) -> str:
    rows = [f"| {e['id']} | {e['kind']} | {_cell(e['before'])} | {_cell(e['after'])} |" for e in examples]
    return "| id | change | before | after |\n|---|---|---|---|\n" + "\n".join(rows) if rows else "no record changed"


def _lengths_md(stats: dict) -> str:
    rows = [f"| {b} | {x} | {y} |" for b, x, y in
            zip(stats["length_buckets"], stats["length_hist_before"], stats["length_hist_after"])]
    return "| characters | records before | records after |\n|---|---|---|\n" + "\n".join(rows)


@dg.asset(group_name="prepare", kinds={"python", "jsonl"}, deps=["raw_records"], code_version="1")
def cleaned_jsonl(context: dg.AssetExecutionContext, config: CleanConfig, data_root: DataRoot) -> dg.MaterializeResult:
    """raw_records cleaned: mojibake repaired, Unicode normalized, control characters and extra whitespace gone,
    title/author/dynasty header lines moved into meta, boilerplate lines stripped by a corpus-wide detector (document
    frequency x positional consistency x template look x shortness, so frequent genuine lines stay), and empty,
    too short, garbled or repetitive records rejected to `_rejected.jsonl` with a reason."""
    with staged_output(data_root.path("cleaned_jsonl")) as out:
        stats = clean_corpus(data_root.path("raw_records"), out, CleanSettings(**config.model_dump()), log=context.log)
    bp = stats["boilerplate"]
    top = bp["top_lines"][:TOP_LINES]
    cols = [("line", "string"), ("count", "int"), ("score", "float"), ("df", "int"), ("position", "float"),
            ("template", "float"), ("short", "float")]
    table = [dg.TableRecord({k: (_cell(t[k]) if k == "line" else t[k]) for k, _ in cols}) for t in top]
    return dg.MaterializeResult(metadata={
        "docs_in": stats["docs_in"],
        "docs_out": dg.MetadataValue.int(stats["docs_out"]),
        **{f"dropped_{r}": stats[f"dropped_{r}"] for r in REASONS},
        "mojibake_repaired": stats["mojibake_repaired"],
        "docs_meta_extracted": stats["docs_meta_extracted"],
        "boilerplate_lines_stripped": bp["lines_stripped"],
        "boilerplate_docs_touched": bp["docs_touched"],
        "boilerplate_top_lines": dg.MetadataValue.table(
            records=table, schema=dg.TableSchema(columns=[dg.TableColumn(k, t) for k, t in cols])),
        "examples": dg.MetadataValue.md(_examples_md(stats["examples"])),
        "length_distribution": dg.MetadataValue.md(_lengths_md(stats)),
        "chars_in": stats["chars_in"],
        "chars_out": stats["chars_out"],
        "seconds": stats["seconds"],
        "path": dg.MetadataValue.path(str(data_root.path("cleaned_jsonl"))),
    })
