"""README.md is the front door: short, the two commands CI and graders run in its first bash block, and every
relative link in it and in docs/*.md leading to a file that exists and, with an #anchor, to one of its headings."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
COMMANDS = (
    "bash scripts/setup.sh && DAGSTER_HOME=$PWD/dagster_home .venv/bin/tokenmill update",
    "bash scripts/setup.sh && .venv/bin/python -X faulthandler -m pytest -q -p no:cacheprovider",
)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(page: Path) -> list[str]:
    """The page's lines outside fenced code blocks (a `# comment` in a bash block is no heading)."""
    kept, fence = [], None
    for line in page.read_text(encoding="utf-8").splitlines():
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker and (fence is None or marker.group(1).startswith(fence)):
            fence = None if fence else marker.group(1)[:3]
            continue
        if fence is None:
            kept.append(line)
    return kept


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation dropped (not '-' or '_'), spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor, repeats numbered as GitHub numbers them (x, x-1, x-2)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page):
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(page: Path) -> list[str]:
    """The targets of the page's links and images, code spans left out (a `[key, value](x)` there is no link)."""
    return [target for line in prose(page) for target in LINK.findall(re.sub(r"(`+).*?\1", "", line))]


def test_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120, "README.md is the front door: move reference text to a docs/ page"
    first = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert first is not None and text.index("```") == first.start(), "the first code block is the bash block"
    assert text[: first.start()].count("\n") <= 3, "the commands are on the first screen"
    lines = [line.strip() for line in first.group(1).splitlines()]
    assert all(command in lines for command in COMMANDS), lines


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_a_file_and_a_heading(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(REPO)}")
    assert broken == []


def test_every_docs_page_is_in_the_readme_and_the_picture_is_small():
    linked = {(REPO / target.partition("#")[0]).resolve() for target in links(README)}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == [], "list the page in README.md's table"
    pictures = [REPO / t for t in links(README) if t.endswith((".svg", ".png"))]
    assert pictures and all(p.stat().st_size < 200_000 for p in pictures)


def test_slug_follows_github():
    assert slug("Incremental runs: source batches, versions, retention") == (
        "incremental-runs-source-batches-versions-retention"
    )
    assert slug("The funnel (`funnel_telemetry`)") == "the-funnel-funnel_telemetry"
    assert slug("Use the tokenizer with transformers") == "use-the-tokenizer-with-transformers"
    assert slug("One run at a time per data root, and recovery") == "one-run-at-a-time-per-data-root-and-recovery"
