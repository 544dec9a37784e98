"""WARC records whose Content-Length lies (too long or too short; first, middle or last in the file), in plain
.warc, one gzip member per record and a gzip of the whole file: the liar is rejected as warc_length_mismatch,
every other record is kept, and a page quoting a WARC header is neither a liar nor a place to resync at."""

import gzip
import re

import pytest

from tests.stages.raw.test_web_readers import crawl, http_response, run, warc_record, write_warc
from tokenmill.stages.raw import RawSettings
from tokenmill.stages.raw.read_warc import read_warc
from tokenmill.stages.raw.stream import Bad, Found

PAGES = 6
# a page quoting WARC headers: mid-line, and at a line start after a single CRLF (a header counts only right after
# a record's CRLF CRLF)
QUOTE = (
    b"<p>A crawl file opens with WARC/1.0 and its fields.</p>\r\n<pre>\r\nWARC/1.0\r\nWARC-Type: response\r\n"
    b"Content-Length: 12\r\n</pre>\r\n"
)


def html(i: int, quote: bytes = b"") -> bytes:
    text = b" ".join(b"Sentence %d of page %d tells its own story." % (j, i) for j in range(40))
    return b"<html><head><title>Page %d</title></head><body><p>%s</p>%s</body></html>" % (i, text, quote)


def pages(quote_in: int | None = None) -> list[bytes]:
    return [
        warc_record(
            "response",
            f"https://example.org/{i}",
            http_response(html(i, QUOTE if i == quote_in else b"")),
            "application/http; msgtype=response",
            i,
        )
        for i in range(PAGES)
    ]


def lie(record: bytes, delta: int) -> bytes:
    """The record with its Content-Length `delta` bytes off; its bytes unchanged."""
    n = int(re.search(rb"Content-Length: (\d+)\r\n", record)[1])
    return record.replace(b"Content-Length: %d\r\n" % n, b"Content-Length: %d\r\n" % (n + delta), 1)


def write(path, records: list[bytes], layout: str) -> list[int]:
    """Writes the records as `layout` (plain, members: one gzip member each, whole: one gzip of the file); returns
    each record's offset as read_warc reports it (in a whole-file gzip, in the decompressed stream)."""
    offsets = write_warc(path, records, gz=layout == "members")
    if layout == "whole":
        path.write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    return offsets


LAYOUTS = {"plain": "crawl.warc", "members": "crawl.warc.gz", "whole": "whole.warc.gz"}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("delta", [5000, -300])
@pytest.mark.parametrize("liar", [0, PAGES // 2, PAGES - 1])
def test_liar_is_rejected_and_every_other_record_kept(tmp_path, layout, delta, liar):
    records = pages()
    records[liar] = lie(records[liar], delta)
    path = tmp_path / LAYOUTS[layout]
    offsets = write(path, records, layout)
    items = list(read_warc(str(path), None, RawSettings()))
    assert [i.at for i in items] == list(range(PAGES))  # one entry per record: none lost, none made up
    bad = items.pop(liar)
    assert isinstance(bad, Bad) and (bad.reason, bad.offset) == ("warc_length_mismatch", offsets[liar])
    assert "Content-Length" in bad.detail
    assert all(isinstance(i, Found) for i in items)
    kept = [i for i in range(PAGES) if i != liar]
    assert [i.value.meta["url"] for i in items] == [f"https://example.org/{i}" for i in kept]
    assert [i.where["offset"] for i in items] == [offsets[i] for i in kept]
    assert all(f"Sentence 39 of page {i} tells" in item.value.text for i, item in zip(kept, items))  # whole pages


@pytest.mark.parametrize("layout", ["plain", "members"])
@pytest.mark.parametrize("slack", [1, 2, 3, 4])
def test_a_length_that_lands_in_the_slack_before_a_later_record_is_caught(tmp_path, layout, slack):
    """Too long by the next record and 1-4 bytes: the length ends in the CR/LF before the record after, which
    FastWARC skips, so it parses on as if the length were true; the header is not where the length says."""
    records = pages()
    records[1] = lie(records[1], len(records[2]) + slack)
    path = tmp_path / LAYOUTS[layout]
    write(path, records, layout)
    items = list(read_warc(str(path), None, RawSettings()))
    assert [(i.at, getattr(i, "reason", None)) for i in items] == [
        (i, "warc_length_mismatch" if i == 1 else None) for i in range(PAGES)
    ]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("trailer", [b"", b"\r\n"])
def test_a_short_or_missing_trailer_is_no_lie(tmp_path, layout, trailer):
    """FastWARC reads records whose CRLF CRLF after the block is short or missing: so does the length check."""
    path = tmp_path / LAYOUTS[layout]
    write(path, [r.removesuffix(b"\r\n\r\n") + trailer for r in pages()], layout)
    items = list(read_warc(str(path), None, RawSettings()))
    assert all(isinstance(i, Found) for i in items) and len(items) == PAGES


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_page_quoting_warc_headers_is_read_whole(tmp_path, layout):
    path = tmp_path / LAYOUTS[layout]
    write(path, pages(quote_in=2), layout)
    items = list(read_warc(str(path), None, RawSettings()))
    assert all(isinstance(i, Found) for i in items) and len(items) == PAGES
    assert "A crawl file opens with WARC/1.0" in items[2].value.text


@pytest.mark.parametrize("layout", ["plain", "whole"])
@pytest.mark.parametrize("delta", [5000, -300])
def test_a_liar_quoting_warc_headers_resyncs_on_the_real_next_record(tmp_path, layout, delta):
    """The quote sits in the last 300 bytes of the liar's block: the first place a too-short length sends FastWARC
    past, where a resync on any "WARC/1." line would land."""
    records = pages(quote_in=2)
    assert len(QUOTE) + len(b"</body></html>") < 300 < len(html(2, QUOTE))
    records[2] = lie(records[2], delta)
    path = tmp_path / LAYOUTS[layout]
    write(path, records, layout)
    items = list(read_warc(str(path), None, RawSettings()))
    assert [(i.at, getattr(i, "reason", None)) for i in items] == [
        (i, "warc_length_mismatch" if i == 2 else None) for i in range(PAGES)
    ]


def test_a_file_cut_inside_its_last_record_is_corrupt_not_a_liar(tmp_path):
    path = tmp_path / "cut.warc"
    data = b"".join(pages())
    path.write_bytes(data[:-500])  # a download that stopped: no trailer after the last block
    items = list(read_warc(str(path), None, RawSettings()))
    assert [getattr(i, "reason", None) for i in items] == [None] * (PAGES - 1) + ["corrupt_warc_record"]


def test_a_record_with_no_usable_length_is_a_bad_header_and_the_next_is_kept(tmp_path):
    """FastWARC reads a missing or non-numeric Content-Length as an empty block: the block is then junk where the
    next header should be, which must not cost the good record after it."""
    records = pages()
    request = warc_record("request", "https://example.org/1", b"GET / HTTP/1.1\r\n\r\n", "application/http", 9)
    records[1:1] = [request.replace(b"Content-Length: 18", b"Content-Length: -18"), request.replace(b"Content-", b"X-")]
    for layout, name in LAYOUTS.items():
        write(tmp_path / name, records, layout)
        items = list(read_warc(str(tmp_path / name), None, RawSettings()))
        assert [getattr(i, "reason", None) for i in items] == [None, "bad_warc_header", "bad_warc_header"] + [None] * (
            PAGES - 1
        ), layout
        assert "no Content-Length" in items[1].detail and all(isinstance(i, Found) for i in items[3:])


def test_raw_stage_counts_every_liar_and_keeps_every_good_page(tmp_path):
    """A crawl (warcinfo, then request, response, metadata per page) with lies in several places and of several
    kinds, three of them back to back, in each layout: in = out + rejected, one warc_length_mismatch per liar."""
    urls = [(f"https://example.org/{i}", http_response(html(i))) for i in range(PAGES)]
    last = ("response", "https://example.org/last", http_response(html(PAGES)), "application/http")
    records = crawl(urls, [last])  # 1 + 3 per page + 1
    # the warcinfo, page 1's response and metadata, page 2's request, the last response
    liars = {0: 5000, 5: -300, 6: 5000, 7: -10, len(records) - 1: -300}
    for i, delta in liars.items():
        records[i] = lie(records[i], delta)
    good = [url for i, (url, _) in enumerate(urls) if 2 + 3 * i not in liars]
    src = tmp_path / "src"
    src.mkdir()
    for layout, name in LAYOUTS.items():
        write(src / name, records, layout)
    stats, recs, rejected = run(src, tmp_path)  # asserts docs_in == docs_out + rejected
    assert stats.rejected_by_reason == {"warc_length_mismatch": len(liars) * len(LAYOUTS)}
    assert stats.docs_out == len(good) * len(LAYOUTS) and stats.docs_in == stats.docs_out + stats.rejected
    assert stats.skipped_records == (len(records) - len(liars) - len(good)) * len(LAYOUTS)
    for name in LAYOUTS.values():
        assert sorted(r["index"] for r in rejected if r["path"] == name) == sorted(liars)
        assert [r["meta"]["url"] for r in recs if r["source"]["path"] == name] == good, name
