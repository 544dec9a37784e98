"""cleaned_jsonl's metadata step: header lines moved into meta, before boilerplate detection."""

from support import POEM, PROSE, clean

from tokenmill.stages.clean.metadata import extract_metadata


def test_header_metadata_moved_into_meta(tmp_path):
    texts = [
        "Title: The Humble Field\nAuthor: Peter Whitlock\n\n" + PROSE,
        "标题：静夜思\n作者：李白\n朝代：唐\n" + POEM,
        "By Jane Austen\n" + PROSE,
        PROSE + "\nTitle: not a header down here",
        "Title: kept from the reader? no\n" + PROSE,
    ]
    metas = [{}, {}, {}, {}, {"title": "Reader Title"}]
    ids, recs, _, stats = clean(tmp_path, texts, metas, language_id=False)  # meta as the header rules leave it
    assert recs[ids[0]]["meta"] == {"title": "The Humble Field", "author": "Peter Whitlock"}
    assert recs[ids[0]]["text"] == PROSE
    assert recs[ids[1]]["meta"] == {"title": "静夜思", "author": "李白", "dynasty": "唐"}
    assert recs[ids[1]]["text"] == POEM
    assert recs[ids[2]]["meta"] == {"author": "Jane Austen"} and recs[ids[2]]["text"] == PROSE
    assert recs[ids[3]]["text"] == texts[3] and recs[ids[3]]["meta"] == {}
    assert recs[ids[4]]["meta"] == {"title": "Reader Title"} and recs[ids[4]]["text"] == PROSE  # reader wins
    assert stats.docs_meta_extracted == 4


def test_reader_title_repeated_in_text_is_dropped():
    text, meta, n = extract_metadata("静夜思\n李白\n" + POEM, {"title": "静夜思", "author": "李白"})
    assert (text, n) == (POEM, 2)
    text, meta, n = extract_metadata(POEM, {"title": "静夜思"})
    assert (text, n) == (POEM, 0)


def test_metadata_extracted_before_boilerplate(tmp_path):
    # "Author: X" header lines sit at the top of every document: the boilerplate detector would take the
    # frequent ones, so extraction must run first and keep them as meta
    texts = [f"Author: Example Writer\nTitle: Poem {i}\n" + PROSE.replace("Tuesday", f"day {i}") for i in range(40)]
    ids, recs, _, stats = clean(tmp_path, texts, bp_min_df=3)
    assert all(r["meta"]["author"] == "Example Writer" for r in recs.values())
    assert recs[ids[7]]["meta"]["title"] == "Poem 7"
