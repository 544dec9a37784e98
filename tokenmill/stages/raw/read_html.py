"""Reader of .html/.htm (and .gz): one page per file, its main text extracted like a WARC response's (html_text);
the record is source {"path", "index": 0} with the page title and the extractor in meta."""

from __future__ import annotations

from collections.abc import Iterator

from tokenmill.stages.raw.html_text import page_text
from tokenmill.stages.raw.records import Mapped
from tokenmill.stages.raw.settings import RawSettings
from tokenmill.stages.raw.stream import Bad, Found, Rejected, open_source, snip


def read_html(path: str, compression: str | None, settings: RawSettings) -> Iterator[Found | Bad]:
    with open_source(path, compression, settings.max_file_bytes, settings.max_record_bytes) as f:
        payload = f.read(settings.html_max_bytes + 1)  # one byte more tells a page over the cap
    try:
        page = page_text(payload, None, settings)
    except Rejected as e:
        yield Bad(key="index", at=0, reason=e.reason, detail=e.detail, snippet=snip(payload[:200]))
        return
    yield Found("index", 0, Mapped(text=page.text, meta=page.meta, shape=page.shape))
