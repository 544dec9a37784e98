"""tokenmill's own main-text extractor: one lxml parse, junk elements dropped in C, one walk that cuts the page
into text blocks, and the main content chosen as the element named as the article's body, or else the smallest
element holding most of the page's prose.

    blocks      the text between block-level boundaries (a paragraph, a list item, a heading, a table row,
                a <pre>), with its link characters and whether it sits in a card (a link wrapping blocks)
    prose       a block's characters outside links, when it is not link-heavy; a card's weighs a quarter
    furniture   blocks under <nav>/<footer>/<aside>, under a boilerplate class or id (nav, cookie, share,
                related, byline, caption...), or in a comment section, each unless it holds so much of the
                prose that it is the page (a false hint, a forum thread)
    container   the span of the elements named as the body (itemprop articleBody, entry-content, post-body...)
                when they hold enough of the prose outside comments; else the deepest element holding
                CONTAINER_SHARE of the prose: the article body, the thread (every post), the grid of items
    output      the container's blocks less furniture, menus and repeated texts, with the heading right above
                it; one block per line, list items as "- item", table rows as tab-separated cells, <pre> verbatim

Why not trafilatura: its XPath pruning and link-density passes were the largest part of the web graph's CPU
(docs/profile.md, 'Parser candidates for our own extractor', 'The whole graph on web input with tokenmill's
extractor'); here a page costs one parse plus one Python step per element. Cost is linear in bytes and elements
(the walk recurses, and lxml caps nesting at 256 levels), and html_text refuses pages above its size and tag caps.
"""

from __future__ import annotations

import itertools
import re
from typing import NamedTuple

from lxml import etree

VERSION = "2"
"""Bumped whenever the same page can come out differently: it is written into every record's meta."""

# dropped with everything inside, before the walk: never text a reader sees
JUNK_TAGS = (
    "script", "style", "template", "svg", "math", "head", "iframe", "object", "embed", "canvas",
    "video", "audio", "figcaption", "button", "select", "option", "textarea", "input", "dialog",
)  # fmt: skip
BLOCK_TAGS = frozenset(
    "address article aside blockquote body br caption center dd details dir div dl dt fieldset figcaption "
    "figure footer form h1 h2 h3 h4 h5 h6 header hgroup hr html legend li main menu nav ol p pre section summary "
    "table tbody td tfoot th thead tr ul".split()
)
HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())
KINDS = HEADINGS | {"p", "li"}  # block kinds told apart in the output
INLINE, BLOCK, FURNITURE, PAGE = "inline", "block", "furniture", "page"
# the commonest inline elements, whose class and id are not looked at: formatting and links, not page parts
PLAIN_INLINE = frozenset("a img picture source strong b em i u small sup sub abbr time br wbr".split())
ROLES = {tag: BLOCK for tag in BLOCK_TAGS} | {
    **dict.fromkeys(("nav", "footer", "aside"), FURNITURE),  # furniture by their tag alone
    **dict.fromkeys(("html", "body"), PAGE),  # blocks whose classes describe the whole page, not a part of it
}
HINT_CACHE_SIZE = 1 << 16
CELLS = frozenset(("td", "th"))
# a class, id or role naming page furniture rather than content
_BOILERPLATE = re.compile(
    r"(?:^|[\s_-])(?:nav|navbar|navigation|menu|breadcrumbs?|footer|sidebar|cookies?|consent|gdpr|newsletter|"
    r"subscribe|subscription|share|sharing|social|related|recommended|popup|modal|advert|ads|adsbygoogle|"
    r"sponsored|promo|nocontent|byline|caption|credits?|latest|trending|popular|most-read|mostread|outbrain|taboola|recirculation|toolbar|pagination|pager|skip-link|sr-only|screen-reader-text|visually-hidden|"
    r"login|signup|masthead|site-header|site-footer|copyright|disclaimer|reviews?|ratings?)(?:$|[\s_-])",
    re.IGNORECASE,
)
# a comment section: furniture under an article, but a forum thread is nothing else
_COMMENTS = re.compile(r"(?:^|[\s_-])comments?(?:$|[\s_-])", re.IGNORECASE)
# an element named as the article's body: the container when it holds enough of the page's prose
_CONTENT = re.compile(r"(?:article|entry|post|story)[-_]?(?:body|content|text)", re.IGNORECASE)
CONTENT_MIN_SHARE = 0.25  # of the page's prose, held by the named elements together (a post's body is one of many)
NAMED_MIN_SHARE = 0.03  # held by each of them (a teaser's "entry-content" in a sidebar is not)
COMMENTS_MAX_SHARE = 0.7  # comments holding more of the page's prose than this are the page (a thread)
LINK_HEAVY = 0.5  # a block with more than this share of its characters in links is navigation-like
CARD_WEIGHT = 0.25
CONTAINER_SHARE = 0.6  # of the page's prose, held by the chosen container
MIN_CONTAINER_BLOCKS = 2  # a container holds blocks: one long paragraph is not the page
MENU_RUN = 3  # consecutive all-link blocks that make a menu
MENU_LINK_SHARE = 0.9
HINT_MAX_SHARE = 0.3  # a hinted element holding more of the page's prose than this is content after all
TAG_MAX_SHARE = 0.9  # the same for <nav>, <footer> and <aside>, whose names are surer than a class's


class Block(NamedTuple):
    text: str
    link_chars: int
    kind: str
    """'p', 'h1'..'h6', 'li', 'cell', 'pre' or 'text' (any other block element)."""
    row: int
    """The table row a cell belongs to (-1 outside tables): consecutive cells of one row share a line."""
    in_card: bool
    """Inside a link that wraps blocks (a card on a listing: title, blurb)."""

    @property
    def link_heavy(self) -> bool:
        return self.link_chars > LINK_HEAVY * len(self.text)

    @property
    def prose(self) -> int:
        return 0 if self.link_heavy else len(self.text) - self.link_chars


class _Walk:
    """One pass over the parsed tree: blocks in document order, and the range of blocks under each block-level
    element and under each element carrying a boilerplate hint."""

    def __init__(self, read_furniture: bool) -> None:
        self.read_furniture = read_furniture
        self.furniture_chars = 0  # characters of the largest <nav>, <footer> or <aside> passed over unread
        self.passed_over: set[int] = set()  # where they were: the number of blocks before each
        self.blocks: list[Block] = []
        self.elements: list[tuple[int, int]] = []  # (first block, end block) per block element, innermost first
        self.furniture: list[tuple[int, int]] = []  # the same for <nav>, <footer> and <aside>
        self.hinted: list[tuple[int, int]] = []  # and for elements with a boilerplate class or id
        self.comments: list[tuple[int, int]] = []  # and for elements naming a comment section
        self.content: list[tuple[int, int]] = []  # and for elements naming the article body
        self.pieces: list[str] = []  # text since the last block boundary
        self.link_chars = 0  # of it, inside links
        self.open: list[str] = ["text"]  # tags of the open block elements
        self.links: list[int] = []  # per open <a>, how many block elements were open when it started
        self.pre = 0  # open <pre> elements
        self.row = -1
        self.rows = 0

    def add(self, text: str) -> None:
        if not self.pre and text.isspace():  # the indentation between tags: one space, and only inside text
            if self.pieces:
                self.pieces.append(" ")
            return
        self.pieces.append(text)
        # text of a link that wraps blocks of its own (a card on a listing: title, blurb) is content
        if self.links and self.links[-1] == len(self.open):
            self.link_chars += len(text)

    def flush(self) -> None:
        raw = "".join(self.pieces)
        self.pieces.clear()
        link_chars, self.link_chars = self.link_chars, 0
        text = raw.strip("\n") if self.pre else " ".join(raw.split())
        if not text or text.isspace():
            return
        tag = self.open[-1]
        kind = "pre" if self.pre else "cell" if tag in CELLS else tag if tag in KINDS else "text"
        in_card = bool(self.links) and self.links[-1] < len(self.open)
        self.blocks.append(Block(text, min(link_chars, len(text)), kind, self.row if kind == "cell" else -1, in_card))

    def visit(self, el) -> None:
        """Read an element and its subtree (lxml caps nesting at 256 levels, so recursion is bounded)."""
        tag = el.tag
        role = ROLES.get(tag, INLINE) if tag.__class__ is str else None
        if role is None:  # an entity or processing instruction left by the parser
            if el.tail:
                self.add(el.tail)
            return
        if role is FURNITURE and not self.read_furniture and not self.pre:
            # its blocks would be left out (_left_out): its characters are counted in C, not read block by block
            if self.pieces:
                self.flush()
            if chars := sum(len(t) for t in el.itertext() if not t.isspace()):
                self.furniture_chars = max(self.furniture_chars, chars)
                self.passed_over.add(len(self.blocks))
            if el.tail:
                self.add(el.tail)
            return
        # hidden elements are read: tabs and accordions hide a product's description, a page's FAQ
        hint = FURNITURE_HINT if role is FURNITURE else NO_HINT
        if role is BLOCK or (role is INLINE and tag not in PLAIN_INLINE):
            key = (el.get("class"), el.get("id"), el.get("itemprop"))
            if key != NO_ATTRIBUTES:
                cached = _HINTS.get(key)
                hint = _hint(key) if cached is None else cached
        opens = (hint or role is not INLINE) and not self.pre
        if opens:
            if self.pieces:
                self.flush()
            first = len(self.blocks)
            self.open.append(tag)
            if tag == "tr":
                self.rows += 1
                self.row = self.rows
        if tag == "a":
            self.links.append(len(self.open))
        elif tag == "pre":
            if self.pieces and not self.pre:
                self.flush()
            self.pre += 1
        if el.text:
            self.add(el.text)
        for child in el:
            self.visit(child)
        if tag == "a":
            self.links.pop()
        elif tag == "pre":
            if self.pre == 1 and self.pieces:  # flushed while still in <pre>: verbatim, kind 'pre'
                self.flush()
            self.pre -= 1
        if opens:
            if self.pieces:
                self.flush()
            self.open.pop()
            self.elements.append((first, len(self.blocks)))
            if role is FURNITURE:
                self.furniture.append((first, len(self.blocks)))
            elif hint is FURNITURE_HINT:
                self.hinted.append((first, len(self.blocks)))
            elif hint is COMMENTS_HINT:
                self.comments.append((first, len(self.blocks)))
            elif hint is CONTENT_HINT:
                self.content.append((first, len(self.blocks)))
            if tag == "tr":
                self.row = -1
        if el.tail:
            self.add(el.tail)


NO_HINT, FURNITURE_HINT, COMMENTS_HINT, CONTENT_HINT = "", "furniture", "comments", "content"
_HINTS: dict[tuple, str] = {}  # (class, id, itemprop) -> hint: class names repeat across a page and a site
NO_ATTRIBUTES = (None, None, None)
# one search tells most names apart from hints (few are); the hint's kind is then looked up in order
_ANY_HINT = re.compile("|".join(p.pattern for p in (_BOILERPLATE, _COMMENTS, _CONTENT)), re.IGNORECASE)


def _hint(key: tuple[str | None, ...]) -> str:
    """What a class, id or itemprop names (furniture, a comment section, the article's body or nothing),
    remembered: the walk looks the triple up first."""
    if len(_HINTS) > HINT_CACHE_SIZE:
        _HINTS.clear()
    hint = NO_HINT
    if any(v and _ANY_HINT.search(v) for v in key):
        names = [v for v in key[:2] if v]  # class and id; itemprop (a schema.org name) only says where the body is
        if any(_BOILERPLATE.search(v) for v in names):
            hint = FURNITURE_HINT
        elif any(_COMMENTS.search(v) for v in names):
            hint = COMMENTS_HINT
        elif any(_CONTENT.search(v) for v in key if v):
            hint = CONTENT_HINT
    _HINTS[key] = hint
    return hint


def _walk(root, read_furniture: bool = False) -> _Walk:
    """The page's blocks. <nav>, <footer> and <aside> are passed over (most of a page's elements, and their blocks
    would be left out) unless one of them may hold TAG_MAX_SHARE of the prose: its characters bound its prose, and
    the page is then walked again, reading them."""
    walk = _Walk(read_furniture)
    walk.visit(root)
    if walk.pieces:
        walk.flush()
    chars = walk.furniture_chars
    if chars and chars > TAG_MAX_SHARE * (sum(b.prose for b in walk.blocks) + chars):
        return _walk(root, read_furniture=True)
    return walk


def _main_blocks(walk: _Walk) -> list[Block]:
    """The blocks of the main content: furniture left out (_left_out), then the container's blocks (_container),
    menus and repeated texts left out."""
    blocks = walk.blocks
    prose = [b.prose for b in blocks]
    comments = _covered(len(blocks), walk.comments)
    dropped = _left_out(walk, prose, comments)
    weighed = [0 if d else CARD_WEIGHT * p if b.in_card else p for b, p, d in zip(blocks, prose, dropped)]
    outside_comments = [0 if c else w for w, c in zip(weighed, comments)]
    first, end = _container(
        walk, list(itertools.accumulate(weighed, initial=0)), list(itertools.accumulate(outside_comments, initial=0))
    )
    if first and blocks[first - 1].kind in HEADINGS and not dropped[first - 1] and first not in walk.passed_over:
        first -= 1  # the heading right above the container is its title
    kept = [b for b, d in zip(blocks[first:end], dropped[first:end]) if not d]
    return _first_copies([b for b, menu in zip(kept, _in_menus(kept)) if not menu])


def _container(walk: _Walk, before: list[float], outside_comments: list[float]) -> tuple[int, int]:
    """The range of blocks holding the main content, given the prose left of blocks[:i] (and of it, what lies
    outside comment sections): the span of the elements named as the article's body when they hold
    CONTENT_MIN_SHARE of the prose outside comments (a blog post above a longer discussion is still the page's
    body), else the deepest element holding CONTAINER_SHARE of all prose, else the whole page. A card's prose
    weighs CARD_WEIGHT: teasers under an article must not outweigh it."""
    total = outside_comments[-1]
    named = [(f, e) for f, e in walk.content if outside_comments[e] - outside_comments[f] >= NAMED_MIN_SHARE * total]
    if named:
        first, end = min(f for f, _ in named), max(e for _, e in named)
        if outside_comments[end] - outside_comments[first] >= CONTENT_MIN_SHARE * total:
            return first, end
    for first, end in walk.elements:  # closed innermost first: the first one holding enough is the deepest
        if end - first >= MIN_CONTAINER_BLOCKS and before[end] - before[first] >= CONTAINER_SHARE * before[-1]:
            return first, end
    return 0, len(walk.blocks)


def _covered(size: int, ranges: list[tuple[int, int]]) -> bytearray:
    """Per block, whether one of the ranges covers it."""
    covered = bytearray(size)
    for first, end in ranges:
        covered[first:end] = b"\x01" * (end - first)
    return covered


def _left_out(walk: _Walk, prose: list[int], comments: bytearray) -> bytearray:
    """Per block, whether it is furniture: under <nav>, <footer> or <aside> (unless that holds TAG_MAX_SHARE of the
    page's prose), then under a boilerplate class or id (HINT_MAX_SHARE of what prose is left), then in the
    comments (COMMENTS_MAX_SHARE of what is left: more, and the comments are the page)."""
    dropped = bytearray(len(prose))

    def left_before() -> list[int]:  # prose not yet dropped of blocks[:i]: a range's sum is one subtraction
        return list(itertools.accumulate((0 if d else p for p, d in zip(prose, dropped)), initial=0))

    for ranges, max_share in ((walk.furniture, TAG_MAX_SHARE), (walk.hinted, HINT_MAX_SHARE)):
        before = left_before()
        for first, end in ranges:
            if before[end] - before[first] <= max_share * before[-1]:
                dropped[first:end] = b"\x01" * (end - first)
    left = left_before()[-1]
    if sum(p for p, c, d in zip(prose, comments, dropped) if c and not d) <= COMMENTS_MAX_SHARE * left:
        dropped = bytearray(d | c for d, c in zip(dropped, comments))
    return dropped


def _first_copies(blocks: list[Block]) -> list[Block]:
    """Each text once: pages repeat a block for another screen size, and a button label after every post;
    table cells and code repeat legitimately and stay."""
    seen: set[str] = set()
    out = []
    for b in blocks:
        if b.kind not in ("cell", "pre"):
            if b.text in seen:
                continue
            seen.add(b.text)
        out.append(b)
    return out


def _in_menus(blocks: list[Block]) -> list[bool]:
    """Whether each block sits in a run of MENU_RUN or more consecutive blocks that are all link (a menu, a tag
    cloud); a lone link between prose (a listing's item title) and a reference list ("Title by Author") stay."""
    menu = [b.link_chars >= MENU_LINK_SHARE * len(b.text) and b.kind not in ("pre", "cell") for b in blocks]
    flags = [False] * len(blocks)
    i = 0
    while i < len(blocks):
        j = i
        while j < len(blocks) and menu[j]:
            j += 1
        if j - i >= MENU_RUN:
            flags[i:j] = [True] * (j - i)
        i = j + 1
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


# scripts, styles and inline SVG are most of a page's characters: cut before parsing, the parse takes much less
# (docs/profile.md, "tokenmill's own extractor (issue 44), first version")
_RAW_TEXT_START = re.compile(r"<(script|style|svg)[\s>/]", re.IGNORECASE)
_RAW_TEXT_END = {tag: re.compile(rf"</{tag}\s*>", re.IGNORECASE) for tag in ("script", "style", "svg")}


def without_scripts(html: str) -> str:
    """The page with its <script>, <style> and <svg> elements cut out (an unclosed one is left to the parser)."""
    kept = []
    pos = 0
    while (start := _RAW_TEXT_START.search(html, pos)) is not None:
        end = _RAW_TEXT_END[start.group(1).lower()].search(html, start.end())
        if end is None:
            break
        kept.append(html[pos : start.start()])
        pos = end.end()
    if not kept:
        return html
    kept.append(html[pos:])
    return "".join(kept)


def main_text(html: str) -> str:
    """The main content of a decoded HTML page, one block per line ('' when it has none)."""
    html = without_scripts(html)
    options = {"remove_comments": True, "remove_pis": True, "no_network": True, "collect_ids": False}
    try:
        root = etree.fromstring(html, etree.HTMLParser(**options))
    except ValueError:  # an <?xml encoding=...?> declaration, which lxml refuses in a str: parse its bytes
        root = etree.fromstring(html.encode("utf-8", "surrogatepass"), etree.HTMLParser(encoding="utf-8", **options))
    if root is None:
        return ""
    etree.strip_elements(root, *JUNK_TAGS, with_tail=False)
    walk = _walk(root)
    return "\n".join(_lines(_main_blocks(walk)))
