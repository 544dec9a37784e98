"""Charsets that lie (issue 46): pages decoded as browsers do (BOM, HTTP charset, <meta charset>, UTF-8) and
detected when the declaration fails, plainly mis-decodes or is missing; meta.charset / meta.charset_source say
which codec read the page and how it was chosen. Honest pages never reach the detector."""

import gzip
import random

import charset_normalizer
import pytest

from tests.conftest import REPO
from tests.stages.raw.test_web_readers import crawl, http_response, run, write_warc
from tokenmill.stages.raw import RawSettings
from tokenmill.stages.raw.html_text import decode_page, misread_latin, page_text
from tokenmill.stages.raw.stream import Rejected

# a few hundred bytes of each language, as a page's paragraph
SENTENCES = {
    "cp1251": "Москва — столица России, крупнейший по численности населения город страны и её политический, "
    "экономический и культурный центр. Город расположен на реке Москве в центре Восточно-Европейской равнины, "
    "в междуречье Оки и Волги.",
    "shift_jis": "東京都は日本の首都であり、関東地方の南部に位置する。人口はおよそ千四百万人で、政治、経済、文化の"
    "中心地として知られている。江戸時代には江戸と呼ばれ、徳川幕府が置かれた。明治元年に東京と改称された。",
    "gb18030": "北京是中华人民共和国的首都，也是全国的政治中心、文化中心、国际交往中心和科技创新中心。北京有着三千多年"
    "的建城史和八百多年的建都史，是世界著名的古都，拥有众多名胜古迹。",
    "gbk": "上海位于中国东部沿海，长江入海口的南岸，是中国最大的经济中心和重要的国际港口城市。上海的外滩、豫园和"
    "南京路吸引着来自世界各地的游客，这座城市以其繁华的夜景和独特的海派文化而闻名。",
    "iso-8859-1": "Paris est la capitale de la France et la ville la plus peuplée du pays. Située au centre du Bassin "
    "parisien, sur une boucle de la Seine, elle est réputée pour ses musées, ses théâtres, sa cuisine raffinée et ses "
    "cafés où l'on déguste un café crème à toute heure.",
    "utf-8": "Zürich, Москва, 東京 and 北京 are written in one page here: UTF-8 holds every script at once, which is "
    "why nine pages in ten on the web are in it. Ça va? Всё хорошо. 大丈夫です。",
}
# the Python codec each page is read with when its charset is known (browsers read gbk and latin-1 as supersets)
CODEC = {
    "cp1251": "cp1251",
    "shift_jis": "shift_jis",
    "gb18030": "gb18030",
    "gbk": "gb18030",
    "iso-8859-1": "cp1252",
    "utf-8": "utf-8",
}
# how a page declares its charset: (HTTP Content-Type charset, <meta charset>)
DECLARATIONS = {
    "right_in_http": lambda cs: (cs, None),
    "right_in_meta": lambda cs: (None, cs),
    "latin1_in_http": lambda cs: ("iso-8859-1", None),
    "utf8_in_meta": lambda cs: (None, "utf-8"),
    "bogus_label": lambda cs: ("x-no-such-charset", None),
    "bogus_meta": lambda cs: (None, "base64"),  # a Python codec, but bytes-to-bytes: no page's charset
    "undeclared": lambda cs: (None, None),
}


def html(sentence: str, meta_charset: str | None = None) -> str:
    meta = f'<meta charset="{meta_charset}">' if meta_charset else ""
    return (
        f"<!DOCTYPE html><html><head>{meta}<title>Page</title></head><body><nav><a href='/'>Home</a> | "
        f"<a href='/about'>About</a></nav><article><h1>Page</h1><p>{sentence}</p></article>"
        "<footer><p>(c) 2024 Example</p></footer></body></html>"
    )


def expected_source(charset: str, http: str | None, meta: str | None) -> str:
    for declared, source in ((http, "http"), (meta, "meta")):
        if declared in ("x-no-such-charset", "base64", None):
            continue
        return source if CODEC.get(declared, declared) == CODEC[charset] else "detected"
    return "default" if charset == "utf-8" else "detected"


@pytest.mark.parametrize("declaration", DECLARATIONS)
@pytest.mark.parametrize("charset", SENTENCES)
def test_charset_matrix(charset, declaration):
    http, meta = DECLARATIONS[declaration](charset)
    sentence = SENTENCES[charset]
    payload = html(sentence, meta).encode(charset)
    assert len(payload) > 300
    decoded = decode_page(payload, http)
    assert decoded.text == html(sentence, meta)
    source = expected_source(charset, http, meta)
    assert (decoded.charset, decoded.source) == (CODEC[charset], source)
    page = page_text(payload, http, RawSettings())
    assert sentence in page.text.split("\n")
    assert page.meta["charset"] == CODEC[charset] and page.meta["charset_source"] == source


def test_honest_pages_never_reach_the_detector(monkeypatch):
    def no_detector(*args, **kwargs):
        raise AssertionError("the detector was asked about an honest page")

    monkeypatch.setattr(charset_normalizer, "from_bytes", no_detector)
    for charset, sentence in SENTENCES.items():
        assert decode_page(html(sentence).encode(charset), charset).text == html(sentence)
        assert decode_page(html(sentence, charset).encode(charset)).text == html(sentence, charset)
    for path in sorted((REPO / "tests" / "fixtures" / "web" / "pages").glob("*.html.gz")):  # the demo's pages
        payload = gzip.decompress(path.read_bytes())
        decoded = decode_page(payload, "utf-8")
        assert decoded.text == payload.decode("utf-8") and decoded.source == "http", path.name
        assert decode_page(payload).source == "meta"


def test_short_and_legitimately_accented_pages_keep_their_reading():
    english = "<html><body><p>Hello, world. A short page.</p></body></html>"
    for http in (None, "utf-8", "iso-8859-1", "x-no-such-charset"):
        assert decode_page(english.encode(), http).text == english
    assert decode_page(english.encode(), "iso-8859-1").charset == "cp1252"
    assert decode_page(english.encode()).source == "default"
    cafe = "<html><body><p>Un café crème, s'il vous plaît.</p></body></html>"
    for http, meta in (("iso-8859-1", None), (None, "iso-8859-1")):
        payload = (cafe if meta is None else cafe.replace("<html>", f'<html><meta charset="{meta}">')).encode("latin-1")
        decoded = decode_page(payload, http)
        assert "café crème" in decoded.text and decoded.charset == "cp1252" and decoded.source in ("http", "meta")
    # Portuguese puts accents side by side ("ção"): enough of them to ask the detector, which reads Latin: kept
    portuguese = (
        "A informação sobre a situação das populações não é clara: as condições de habitação são más, a educação e a "
        "proteção da nação exigem soluções. As associações pedem atenção às questões da região e às ações de "
        "prevenção, à organização da comunicação e à exposição das contradições."
    )
    assert misread_latin(portuguese)
    decoded = decode_page(f"<p>{portuguese}</p>".encode("latin-1"), "iso-8859-1")
    assert decoded.text == f"<p>{portuguese}</p>" and (decoded.charset, decoded.source) == ("cp1252", "http")
    # six bytes of Cyrillic are too few to tell a charset by: rejected rather than guessed (they read as Big5)
    with pytest.raises(Rejected) as e:
        decode_page("<p>Москва</p>".encode("cp1251"))
    assert e.value.reason == "undecodable_bytes" and "too few" in e.value.detail


def test_bytes_no_codec_decodes_are_rejected_naming_what_was_tried():
    rng = random.Random(46)
    for size in (300, 4000, 100_000):
        noise = bytes(rng.getrandbits(8) for _ in range(size))
        for http in (None, "utf-8", "x-no-such-charset"):
            with pytest.raises(Rejected) as e:
                decode_page(noise, http)
            assert e.value.reason == "undecodable_bytes"
            assert e.value.detail.startswith("not utf-8") and "charset-normalizer" in e.value.detail
    # UTF-8 with one bad byte is damaged UTF-8: read as another charset its text would be garbled
    damaged = html(SENTENCES["cp1251"]).encode() + b"\xff"
    with pytest.raises(Rejected) as e:
        decode_page(damaged, "utf-8")
    assert "UTF-8 with 1 invalid sequences" in e.value.detail


def test_byte_order_mark_wins_over_what_is_declared():
    page = html(SENTENCES["utf-8"], "iso-8859-1")
    decoded = decode_page(b"\xef\xbb\xbf" + page.encode(), "iso-8859-1")
    assert (decoded.text, decoded.charset, decoded.source) == (page, "utf-8", "bom")
    decoded = decode_page(b"\xff\xfe" + page.encode("utf-16-le"), "utf-8")
    assert (decoded.text, decoded.charset, decoded.source) == (page, "utf-16-le", "bom")


@pytest.mark.parametrize("label", ["base64", "hex", "zlib", "idna", "punycode", "undefined", "utf-7", "utf-16"])
def test_labels_that_name_no_page_charset_count_as_undeclared(label):
    """Python codecs but no page's charset (bytes-to-bytes, UTF-7, UTF-16 for bytes with no NUL): before, some
    raised LookupError or UnicodeError out of the reader, others decoded the page into garbage."""
    for http, meta in ((None, label), (label, None)):
        page = html(SENTENCES["utf-8"], meta)
        decoded = decode_page(page.encode(), http)
        assert (decoded.text, decoded.charset, decoded.source) == (page, "utf-8", "default")
    page = html(SENTENCES["utf-8"])
    decoded = decode_page(page.encode("utf-16-le"), "utf-16-le")  # an honest UTF-16 header is kept
    assert (decoded.text, decoded.charset, decoded.source) == (page, "utf-16-le", "http")


def test_records_carry_the_charset_in_meta(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    lying = html(SENTENCES["cp1251"]).encode("cp1251")
    honest = html(SENTENCES["shift_jis"]).encode("shift_jis")
    pages = [
        ("https://example.ru/", http_response(lying, "text/html; charset=iso-8859-1")),
        ("https://example.jp/", http_response(honest, "text/html; charset=Shift_JIS")),
    ]
    write_warc(src / "crawl.warc.gz", crawl(pages))
    (src / "page.html").write_bytes(html(SENTENCES["gbk"], "utf-8").encode("gbk"))
    stats, recs, rejected = run(src, tmp_path)
    assert not rejected and stats.docs_out == 3
    got = {r["source"]["path"] + str(r["source"]["index"]): r for r in recs}
    assert set(got) == {"crawl.warc.gz2", "crawl.warc.gz5", "page.html0"}
    for key, sentence, charset, source in (
        ("crawl.warc.gz2", SENTENCES["cp1251"], "cp1251", "detected"),
        ("crawl.warc.gz5", SENTENCES["shift_jis"], "shift_jis", "http"),
        ("page.html0", SENTENCES["gbk"], "gb18030", "detected"),
    ):
        assert sentence in got[key]["text"].split("\n")
        assert (got[key]["meta"]["charset"], got[key]["meta"]["charset_source"]) == (charset, source)
