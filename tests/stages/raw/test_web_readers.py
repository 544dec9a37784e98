"""raw_records' web inputs: WARC/WET readers (real pages written into WARC files at test time), .html(.gz) files,
bad input (a cut gzip member, a bad header, an undecodable payload), skip counts, bounded time per page."""

import gzip
import io
import json
import time
import zlib
from pathlib import Path

import pytest
from fastwarc.stream_io import BrotliWriter

from tests.conftest import REPO
from tokenmill.common.io import REJECTED_FILE, iter_jsonl, record_shards
from tokenmill.stages.raw import RawSettings, ingest
from tokenmill.stages.raw.html_text import decode_html, page_text
from tokenmill.stages.raw.read_warc import read_warc
from tokenmill.stages.raw.stream import Found, Rejected

PAGES = REPO / "tests" / "fixtures" / "web" / "pages"
DATE = "2024-05-01T12:00:00Z"
# a phrase of each page's main text, and boilerplate of the same page that must not survive extraction
MAIN_TEXT = {
    "en_wikipedia_mozilla": ("Mozilla is a free-software community", "Jump to navigation"),
    "zh_wikipedia_caocao": ("曹操（155年－220年3月15日），字孟德", "跳到导航"),
    "ja_wikipedia_press_release": ("30万件目の項目は“パウル・ヘルマン・ミュラー”", "最近の更新"),
    "ko_wikipedia_korean_wikipedia": ("한국어 위키백과(영어: Korean Wikipedia)는", "본문으로 이동"),
    "ru_tolstoy_anna_karenina": ("Все счастливые семьи похожи друг на друга", "Новые поступления"),
}


def page(name: str) -> bytes:
    return gzip.decompress((PAGES / f"{name}.html.gz").read_bytes())


def warc_record(kind: str, url: str, block: bytes, content_type: str, n: int) -> bytes:
    head = (
        f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {url}\r\nWARC-Date: {DATE}\r\n"
        f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{n:012d}>\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(block)}\r\n\r\n"
    )
    return head.encode() + block + b"\r\n\r\n"


def http_response(body: bytes, content_type: str = "text/html; charset=utf-8", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n\r\n".encode() + body


def crawl(pages: list[tuple[str, bytes]], extra: list[tuple[str, str, bytes, str]] = ()) -> list[bytes]:
    """WARC records as a crawler writes them: warcinfo, then request + response (+ metadata) per page."""
    out = [warc_record("warcinfo", "", b"software: tokenmill-tests\r\n", "application/warc-fields", 0)]
    for url, body in pages:
        out.append(warc_record("request", url, b"GET / HTTP/1.1\r\n\r\n", "application/http; msgtype=request", 1))
        out.append(warc_record("response", url, body, "application/http; msgtype=response", 2))
        out.append(warc_record("metadata", url, b"fetchTimeMs: 12\r\n", "application/warc-fields", 3))
    out += [warc_record(kind, url, block, ct, 4) for kind, url, block, ct in extra]
    return out


def write_warc(path: Path, records: list[bytes], gz: bool = True) -> list[int]:
    """Writes the records (one gzip member each when gz); returns each record's byte offset."""
    offsets, data = [], b""
    for rec in records:
        offsets.append(len(data))
        data += gzip.compress(rec, mtime=0) if gz else rec
    path.write_bytes(data)
    return offsets


def run(source: Path, tmp_path: Path, **settings) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
    stats = ingest(source, out, RawSettings(**settings), workers=1)
    assert stats.docs_in == stats.docs_out + stats.rejected
    recs = [r for shard in record_shards(out) for r in iter_jsonl(shard)]
    rejected = [json.loads(line) for line in (out / REJECTED_FILE).read_text(encoding="utf-8").splitlines()]
    return stats, recs, rejected


def multilingual_pages() -> list[tuple[str, bytes]]:
    return [(f"https://example.org/{name}", http_response(page(name))) for name in MAIN_TEXT]


# ------------------------------------------------------------------------------------------ WARC / WET


def test_warc_gz_members_meta_and_skip_counts(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    extra = [
        ("response", "https://example.org/logo.png", http_response(b"\x89PNG....", "image/png"), "application/http"),
        (
            "response",
            "https://example.org/moved",
            http_response(b"<html></html>", status="301 Moved"),
            "application/http",
        ),
        ("revisit", "https://example.org/again", b"HTTP/1.1 200 OK\r\n\r\n", "application/http"),
    ]
    write_warc(src / "crawl.warc.gz", crawl(multilingual_pages(), extra))
    stats, recs, rejected = run(src, tmp_path)
    assert not rejected and stats.docs_out == len(MAIN_TEXT)
    assert stats.skipped_records_by_reason == {
        "http_status_not_ok": 1,
        "metadata_record": 5,
        "non_html_response": 1,
        "request_record": 5,
        "revisit_record": 1,
        "warcinfo_record": 1,
    }
    assert stats.skipped_records == 14 and stats.files[0]["skipped_by_reason"]["request_record"] == 5
    for rec, name in zip(recs, MAIN_TEXT):
        main, boilerplate = MAIN_TEXT[name]
        assert main in rec["text"], name
        assert boilerplate is None or boilerplate not in rec["text"]
        assert "\n" in rec["text"]  # paragraphs kept as lines
        meta = rec["meta"]
        assert meta["url"] == f"https://example.org/{name}" and meta["date"] == DATE
        assert meta["content_type"] == "text/html; charset=utf-8" and meta["title"]
    assert recs[1]["meta"]["title"] == "曹操 - 维基百科，自由的百科全书"


def test_source_offset_reopens_the_same_record(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    offsets = write_warc(src / "crawl.warc.gz", crawl(multilingual_pages()))
    _, recs, _ = run(src, tmp_path)
    for rec in recs:
        source = rec["source"]
        assert set(source) == {"path", "index", "offset"} and source["offset"] == offsets[source["index"]]
        with open(src / source["path"], "rb") as f:  # seek to the offset and read one record from there
            f.seek(source["offset"])
            again = next(i for i in read_warc_from(f) if isinstance(i, Found))
        assert again.value.text == rec["text"] and again.value.meta["url"] == rec["meta"]["url"]


def read_warc_from(f):
    """read_warc on the rest of an open file (a copy of it: read_warc opens paths)."""
    rest = f.read()
    path = Path(f.name).with_suffix(".rest")
    path.write_bytes(rest)
    return read_warc(str(path), None, RawSettings())


def test_uncompressed_warc_and_wet(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    write_warc(src / "plain.warc", crawl(multilingual_pages()[:2]), gz=False)
    texts = ["First converted page.\nSecond line.", "第二个页面的文本。"]
    wet = [warc_record("warcinfo", "", b"x: y\r\n", "application/warc-fields", 0)] + [
        warc_record("conversion", f"https://example.org/wet{i}", t.encode(), "text/plain", i + 1)
        for i, t in enumerate(texts)
    ]
    write_warc(src / "sample.warc.wet.gz", wet)
    stats, recs, rejected = run(src, tmp_path)
    assert not rejected and stats.docs_out == 4
    assert [r["text"] for r in recs[2:]] == texts  # sorted paths: plain.warc, then sample.warc.wet.gz
    assert recs[2]["meta"] == {"url": "https://example.org/wet0", "date": DATE, "content_type": "text/plain"}
    assert MAIN_TEXT["en_wikipedia_mozilla"][0] in recs[0]["text"]


def test_cut_gzip_member_bad_header_and_undecodable_payload(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    records = crawl(multilingual_pages())
    bad_header = records[5].replace(b"WARC/1.0", b"WARX/9.9", 1)  # zh's response
    # bytes no charset decodes (a Latin-1 page declared UTF-8 is detected: tests/stages/raw/test_charsets.py)
    undecodable = http_response(b"<html><body><p>" + b"\x80\x81\xfe\xff" * 50 + b"</p></body></html>")
    records = (
        records[:5]
        + [bad_header]
        + records[6:]
        + [warc_record("response", "https://example.org/latin1", undecodable, "application/http", 9)]
    )
    offsets = write_warc(src / "broken.warc.gz", records)
    data = bytearray((src / "broken.warc.gz").read_bytes())
    cut_at = offsets[8]  # ja's response: its gzip member cut in half in the middle of the file
    member = data[cut_at : offsets[9]]
    data[cut_at : offsets[9]] = member[: len(member) // 2]
    (src / "broken.warc.gz").write_bytes(bytes(data))
    stats, recs, rejected = run(src, tmp_path)
    by_reason = {r["reason"]: r for r in rejected}
    assert set(by_reason) == {"bad_warc_header", "corrupt_warc_record", "undecodable_bytes"}
    assert by_reason["bad_warc_header"]["offset"] == offsets[5]
    assert by_reason["corrupt_warc_record"]["offset"] == cut_at
    assert "not utf-8" in by_reason["undecodable_bytes"]["detail"]
    assert all(r["path"] == "broken.warc.gz" and "index" in r for r in rejected)
    # the rest of the file is read: en before, ko and ru after the cut member
    assert [r["meta"]["url"].rsplit("/", 1)[1] for r in recs] == [
        "en_wikipedia_mozilla",
        "ko_wikipedia_korean_wikipedia",
        "ru_tolstoy_anna_karenina",
    ]
    assert stats.dropped["corrupt_warc_record"] == 1 and stats.docs_in == 6


def test_uncompressed_warc_resyncs_after_junk_and_a_missing_length(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    records = crawl(multilingual_pages()[:3])
    no_length = records[5].replace(b"Content-Length", b"Content-Size", 1)  # zh's response
    records = records[:5] + [no_length] + records[6:8] + [b"junk between records\r\n"] + records[8:]
    offsets = write_warc(src / "plain.warc", records, gz=False)
    stats, recs, rejected = run(src, tmp_path)
    assert [r["reason"] for r in rejected] == ["bad_warc_header", "bad_warc_header"]
    assert rejected[1]["offset"] == offsets[8] and rejected[1]["snippet"].startswith("junk between records")
    assert [r["meta"]["url"].rsplit("/", 1)[1] for r in recs] == ["en_wikipedia_mozilla", "ja_wikipedia_press_release"]
    assert all(r["source"]["offset"] == offsets[r["source"]["index"]] for r in recs)


def brotli(data: bytes) -> bytes:
    out = io.BytesIO()
    writer = BrotliWriter(out)
    writer.write(data)
    writer.close()  # flushes the last block (finish() does not)
    return out.getvalue()


def chunked(data: bytes, size: int = 1000) -> bytes:
    chunks = [data[i : i + size] for i in range(0, len(data), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


def test_content_and_transfer_encodings_are_decoded(tmp_path):
    html = page("en_wikipedia_mozilla")
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
    encoded = {  # name -> (extra HTTP headers, body as the server sent it)
        "plain": ("", html),
        "gzip": ("Content-Encoding: gzip", gzip.compress(html)),
        "x-gzip": ("Content-Encoding: x-gzip", gzip.compress(html)),
        "deflate": ("Content-Encoding: deflate", zlib.compress(html)),
        "raw-deflate": ("Content-Encoding: deflate", deflate.compress(html) + deflate.flush()),
        "br": ("Content-Encoding: br", brotli(html)),
        "chunked": ("Transfer-Encoding: chunked", chunked(html)),
        "chunked-gzip": ("Transfer-Encoding: chunked\r\nContent-Encoding: gzip", chunked(gzip.compress(html))),
        "stored-dechunked": ("Transfer-Encoding: chunked", html),  # some crawlers keep the header, not the chunks
        "bad-gzip": ("Content-Encoding: gzip", b"\x1f\x8b\x08 not gzip after all"),
        "unknown": ("Content-Encoding: compress", b"\x1f\x9d..."),
        "bomb": ("Content-Encoding: gzip", gzip.compress(b"<html><body><p>" + b"a" * (64 << 20))),
    }
    responses = []
    for name, (headers, body) in encoded.items():
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n{headers}\r\n".replace("\r\n\r\n", "\r\n")
        responses.append(
            ("response", f"https://example.org/{name}", head.encode() + b"\r\n" + body, "application/http")
        )
    src = tmp_path / "src"
    src.mkdir()
    write_warc(src / "encoded.warc.gz", crawl([], responses))
    t0 = time.perf_counter()
    stats, recs, rejected = run(src, tmp_path)
    assert time.perf_counter() - t0 < 20  # the 64 MB bomb is cut at html_max_bytes, never inflated whole
    texts = {r["meta"]["url"].rsplit("/", 1)[1]: r["text"] for r in recs}
    assert list(texts) == [
        "plain",
        "gzip",
        "x-gzip",
        "deflate",
        "raw-deflate",
        "br",
        "chunked",
        "chunked-gzip",
        "stored-dechunked",
    ]
    assert set(texts.values()) == {texts["plain"]} and MAIN_TEXT["en_wikipedia_mozilla"][0] in texts["plain"]
    assert [r["reason"] for r in rejected] == ["undecodable_bytes", "undecodable_bytes", "record_too_large"]
    bad_gzip, unknown, bomb = (r["detail"] for r in rejected)
    assert bad_gzip.startswith("the payload's gzip coding does not decode: ")
    assert unknown == "unknown HTTP content coding 'compress'" and "html_max_bytes" in bomb


def test_same_output_for_any_worker_count(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        write_warc(src / f"c{i}.warc.gz", crawl(multilingual_pages()[i : i + 2]))
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        ingest(src, out, RawSettings(task_mb=0.01), workers=workers)
        outs.append([p.read_bytes() for p in record_shards(out)])
    assert outs[0] == outs[1] and outs[0]


# ------------------------------------------------------------------------------------------ HTML files, charsets


def test_html_files_one_record_each(tmp_path):
    stats, recs, rejected = run(PAGES, tmp_path)
    assert not rejected and stats.docs_out == len(MAIN_TEXT)
    for rec in recs:
        name = rec["source"]["path"].removesuffix(".html.gz")
        assert rec["source"] == {"path": f"{name}.html.gz", "index": 0}
        assert MAIN_TEXT[name][0] in rec["text"] and rec["meta"]["title"]
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "page.htm").write_bytes(page("zh_wikipedia_caocao"))
    (plain / "empty.html").write_bytes(
        b"<html><head><title>App</title></head><body><script>app()</script></body></html>"
    )
    stats, recs, rejected = run(plain, tmp_path)
    assert [r["source"]["path"] for r in recs] == ["page.htm"]
    assert [(r["path"], r["index"], r["reason"]) for r in rejected] == [("empty.html", 0, "extraction_empty")]


def test_charsets_http_then_meta_then_utf8():
    text = "曹操，字孟德，沛国谯县人。"
    body = f"<html><head><meta charset='gb2312'></head><body><p>{text}</p></body></html>"
    assert text in decode_html(body.encode("gb18030"))  # the meta charset (gb2312 read as its superset)
    assert text in decode_html(body.encode("gb18030"), "GBK")  # the HTTP charset wins
    assert text in decode_html(body.encode("utf-8"), "iso-8859-1")  # declared wrong: UTF-8 fits
    assert "é" in decode_html(b"<p>caf\xe9</p>", "iso-8859-1")  # latin-1 read as windows-1252
    assert "é" in decode_html(b"<p>caf\xe9</p>")  # undeclared and not UTF-8: detected (test_charsets.py)


def test_pathological_pages_are_bounded_in_time():
    depth = 5 * 1024 * 1024 // 11  # 5 MB of nested divs
    nested = ("<html><body>" + "<div>" * depth + "<p>deep text</p>" + "</div>" * depth + "</body></html>").encode()
    settings = RawSettings()
    t0 = time.perf_counter()
    with pytest.raises(Rejected) as e:  # over html_max_bytes: refused before any parsing
        page_text(nested, None, settings)
    assert e.value.reason == "record_too_large" and time.perf_counter() - t0 < 1
    t0 = time.perf_counter()
    with pytest.raises(Rejected) as e:  # caps raised: the tag cap refuses it after one count
        page_text(nested, None, settings.model_copy(update={"html_max_bytes": 8 << 20}))
    assert e.value.reason == "record_too_large" and "html_max_tags" in e.value.detail
    assert time.perf_counter() - t0 < 2
    t0 = time.perf_counter()
    with pytest.raises(Rejected):  # no caps: lxml bounds the nesting depth at 256, the text below it is lost
        page_text(nested, None, settings.model_copy(update={"html_max_bytes": 8 << 20, "html_max_tags": 10_000_000}))
    assert time.perf_counter() - t0 < 30
