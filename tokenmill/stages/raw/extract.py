"""tokenmill's own main-text extractor: one lxml parse, junk elements dropped in C, one walk that cuts the page
into text blocks, and the main content chosen as the smallest element holding most of the page's prose.

    blocks      the text between block-level boundaries (a paragraph, a list item, a heading, a table row,
                a <pre>), with its link characters and whether a boilerplate hint (class/id/role such as
                nav, footer, cookie, share, related) sits above it
    prose       a block's characters outside links, when it is not link-heavy and not under a hint
    container   the deepest element whose blocks hold CONTAINER_SHARE of the page's prose: the article body
                on an article, the thread (every post) on a forum, the grid of items on a listing
    output      the container's blocks, hinted and link-heavy navigation left out; one block per line,
                list items as "- item", table rows as tab-separated cells, <pre> verbatim

Why not trafilatura: its XPath pruning and link-density passes cost ~30 ms a page and were half of the web
graph's CPU; here a page costs one parse plus one Python step per element. Cost is linear in bytes and elements
(lxml caps nesting depth and the walk is iterative), and html_text refuses pages above its size and tag caps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lxml import etree

VERSION = "1"
"""Bumped whenever the same page can come out differently: it is written into every record's meta."""

# dropped with everything inside, before the walk: never text a reader sees
JUNK_TAGS = (
    "script", "style", "template", "svg", "math", "head", "iframe", "object", "embed", "canvas",
    "video", "audio", "button", "select", "option", "textarea", "input", "dialog",
)  # fmt: skip
BLOCK_TAGS = frozenset(
    "address article aside blockquote body br caption center dd details dialog dir div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend li main menu nav ol p pre section summary "
    "table tbody td tfoot th thead tr ul".split()
)
HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
CELLS = frozenset(("td", "th"))
# a class, id or role naming page furniture rather than content
_BOILERPLATE = re.compile(
    r"(?:^|[\s_-])(?:nav|navbar|navigation|menu|breadcrumbs?|footer|sidebar|cookies?|consent|gdpr|newsletter|"
    r"subscribe|subscription|share|sharing|social|related|recommended|popup|modal|advert|ads|adsbygoogle|"
    r"sponsored|promo|toolbar|pagination|pager|skip-link|sr-only|screen-reader-text|visually-hidden|"
    r"login|signup|masthead|site-header|site-footer|copyright|disclaimer|reviews?|ratings?)(?:$|[\s_-])",
    re.IGNORECASE,
)
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.IGNORECASE)
LINK_HEAVY = 0.5  # a block with more than this share of its characters in links is navigation-like
CONTAINER_SHARE = 0.6  # of the page's prose, held by the chosen container
MENU_RUN = 3  # consecutive link-heavy blocks that make a menu
HINT_MAX_SHARE = 0.3  # a hinted element holding more of the page's prose than this is content after all


@dataclass(frozen=True)
class Block:
    text: str
    link_chars: int
    kind: str
    """'p', 'h1'..'h6', 'li', 'cell', 'pre' or 'text' (any other block element)."""
    row: int
    """The table row a cell belongs to (-1 outside tables): consecutive cells of one row share a line."""

    @property
    def link_heavy(self) -> bool:
        return self.link_chars > LINK_HEAVY * len(self.text)

    @property
    def prose(self) -> int:
        return 0 if self.link_heavy else len(self.text) - self.link_chars


class _Walk:
    """One pass over the parsed tree: blocks in document order, and the range of blocks under each block-level
    element and under each element carrying a boilerplate hint."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.elements: list[tuple[int, int]] = []  # (first block, end block) per block element, innermost first
        self.hinted: list[tuple[int, int]] = []  # the same for elements with a boilerplate hint
        self._pieces: list[str] = []
        self._link_chars = 0
        self._frames: list[tuple] = []  # open block elements: (element, tag, first block, hinted)
        self._links: list[int] = []  # per open <a>, how many block elements were open when it started
        self._pre = 0  # open <pre> elements
        self._row = -1
        self._rows = 0

    def add(self, text: str | None) -> None:
        if text:
            self._pieces.append(text)
            # text of a link that wraps blocks of its own (a card on a listing: title, blurb) is content
            if self._links and self._links[-1] == len(self._frames):
                self._link_chars += len(text)

    def flush(self) -> None:
        if not self._pieces:
            return
        raw = "".join(self._pieces)
        self._pieces.clear()
        link_chars, self._link_chars = self._link_chars, 0
        text = raw.strip("\n") if self._pre else " ".join(raw.split())
        if not text.strip():
            return
        tag = self._frames[-1][1] if self._frames else "text"
        if self._pre:
            kind = "pre"
        elif tag in CELLS:
            kind = "cell"
        elif tag in HEADINGS or tag in ("p", "li"):
            kind = tag
        else:
            kind = "text"
        self.blocks.append(Block(text, min(link_chars, len(text)), kind, self._row if kind == "cell" else -1))

    def start(self, el) -> bool:
        """Enter an element; False when its subtree is hidden and must not be read."""
        tag = el.tag
        attrs = el.attrib
        hinted = False
        if attrs:
            if "hidden" in attrs or attrs.get("aria-hidden") == "true":
                return False
            style = attrs.get("style")
            if style and _HIDDEN_STYLE.search(style):
                return False
            hint = " ".join(v for v in (attrs.get("class"), attrs.get("id"), attrs.get("role")) if v)
            hinted = bool(hint) and tag not in ("html", "body") and _BOILERPLATE.search(hint) is not None
        if (hinted or tag in BLOCK_TAGS) and not self._pre:
            self.flush()
            if tag == "tr":
                self._rows += 1
                self._row = self._rows
            self._frames.append((el, tag, len(self.blocks), hinted))
        if tag == "a":
            self._links.append(len(self._frames))
        elif tag == "pre":
            if not self._pre:
                self.flush()
            self._pre += 1
        self.add(el.text)
        return True

    def end(self, el) -> None:
        tag = el.tag
        if tag == "pre":
            self._pre -= 1
        elif tag == "a" and self._links:
            self._links.pop()
        if self._frames and self._frames[-1][0] is el:
            self.flush()
            _, _, first, hinted = self._frames.pop()
            self.elements.append((first, len(self.blocks)))
            if hinted:
                self.hinted.append((first, len(self.blocks)))
            if tag == "tr":
                self._row = -1
        self.add(el.tail)


def _walk(root) -> _Walk:
    walk = _Walk()
    events = etree.iterwalk(root, events=("start", "end"))
    skipped = None
    for event, el in events:
        if not isinstance(el.tag, str):
            continue
        if event == "start":
            if not walk.start(el):
                events.skip_subtree()  # its end event still comes, next: only its tail is read then
                skipped = el
        elif el is skipped:
            skipped = None
            walk.add(el.tail)
        else:
            walk.end(el)
    walk.flush()
    return walk


def _main_blocks(walk: _Walk) -> list[Block]:
    """The blocks of the main content: hinted furniture left out unless it holds much of the page's prose (a
    hint on a wrapper of everything is a false one), then the deepest element holding CONTAINER_SHARE of what
    prose is left, its navigation-like blocks left out."""
    blocks = walk.blocks
    prose = [b.prose for b in blocks]
    total = sum(prose)
    dropped = bytearray(len(blocks))
    for first, end in walk.hinted:
        if sum(prose[first:end]) <= HINT_MAX_SHARE * total:
            dropped[first:end] = b"\x01" * (end - first)
    cumulative = [0]
    for p, d in zip(prose, dropped):
        cumulative.append(cumulative[-1] + (0 if d else p))
    first, end = 0, len(blocks)
    need = CONTAINER_SHARE * cumulative[-1]
    for f, e in walk.elements:  # closed innermost first: the first one holding enough is the deepest
        if cumulative[e] - cumulative[f] >= need:
            first, end = f, e
            break
    kept = [b for b, d in zip(blocks[first:end], dropped[first:end]) if not d]
    return [b for b, menu in zip(kept, _in_menus(kept)) if not menu]


def _in_menus(blocks: list[Block]) -> list[bool]:
    """Whether each block sits in a run of MENU_RUN or more consecutive link-heavy blocks (a menu, a tag cloud);
    a lone link between prose (a listing's item title) is kept."""
    flags = [False] * len(blocks)
    i = 0
    while i < len(blocks):
        if blocks[i].link_heavy and blocks[i].kind not in ("pre", "cell"):
            j = i
            while j < len(blocks) and blocks[j].link_heavy and blocks[j].kind not in ("pre", "cell"):
                j += 1
            if j - i >= MENU_RUN:
                flags[i:j] = [True] * (j - i)
            i = j
        else:
            i += 1
    return flags


def _lines(blocks: list[Block]) -> list[str]:
    lines: list[str] = []
    row = -1
    for block in blocks:
        if block.kind == "cell" and block.row == row:
            lines[-1] += "\t" + block.text
            continue
        row = block.row
        lines.append("- " + block.text if block.kind == "li" else block.text)
    return lines


def main_text(html: str) -> str:
    """The main content of a decoded HTML page, one block per line ('' when it has none)."""
    root = etree.fromstring(html, etree.HTMLParser(remove_comments=True, remove_pis=True, no_network=True))
    if root is None:
        return ""
    etree.strip_elements(root, *JUNK_TAGS, with_tail=False)
    walk = _walk(root)
    return "\n".join(_lines(_main_blocks(walk)))
