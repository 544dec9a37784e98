"""The funnel chart (`funnel.svg`): records per stage, how the stage counts moved over the last materializations, and
tokens per language, written as SVG text. No plotting library: matplotlib's import and a render were a large part of a
one-file update (docs/profile.md, 'A one-file update of the demo corpus'), this is string formatting, and the UI shows
the vector image at any zoom."""

from __future__ import annotations

from html import escape
from pathlib import Path

from tokenmill.stages.telemetry import Funnel, LanguageCounts

WIDTH, HEIGHT = 400, 290  # one panel; the chart has two, or three with languages
TOP, BOTTOM = 34, 30  # room for a panel's title above and its axis labels below
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'
LEGEND_WIDTH = 125  # px right of the history panel's lines
CHAR_WIDTH = 6.2  # px of an average character at 11 px: labels are laid out without font metrics
BAR_COLOUR, LANGUAGE_COLOUR = "#4f6bed", "#2a9d8f"
# one look per funnel row, drawn in order: each later row has a smaller marker of another shape on top, so a row
# whose counts equal the next one's (nothing dropped: tokenized = after dedup) still shows around it
LINE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
MARKERS = ("circle", "square", "diamond", "triangle", "triangle-down", "plus")
DASHES = ("", "6 3", "6 3 1.5 3", "1.5 3")
LANGUAGES_DRAWN = 12  # bars of the per-language panel; the other languages are summed into one "other" bar


def funnel_chart_svg(funnel: Funnel, history: list[dict], path: Path) -> Path:
    """The chart of `funnel` (build_funnel) after the `history` rows (history_row, oldest first), written to path."""
    Path(path).write_text(funnel_svg(funnel, history), encoding="utf-8")
    return path


def funnel_svg(funnel: Funnel, history: list[dict]) -> str:
    labels = ["input"] + [s.label for s in funnel.stages]
    counts = [funnel.stages[0].docs_in] + [s.docs_out for s in funnel.stages]
    runs = history + [dict(zip(labels, counts))]
    panels = [
        bar_panel("records per stage", labels, counts, [f" {c:,}" for c in counts], BAR_COLOUR),
        history_panel(f"last {len(runs)} materializations", labels, runs),
    ]
    if funnel.languages:
        panels.append(language_panel(funnel.languages))
    width = WIDTH * len(panels)
    body = "".join(f'<g transform="translate({WIDTH * i},0)">{panel}</g>' for i, panel in enumerate(panels))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT}" viewBox="0 0 {width} {HEIGHT}" '
        f'{FONT} font-size="11"><rect width="{width}" height="{HEIGHT}" fill="white"/>{body}</svg>\n'
    )


def bar_panel(title: str, labels: list[str], values: list[int], notes: list[str], colour: str) -> str:
    """Horizontal bars, the first label on top, each with its note after the bar."""
    left = 12 + CHAR_WIDTH * max(len(label) for label in labels)
    note_room = CHAR_WIDTH * max(len(note) for note in notes)
    scale = (WIDTH - 10 - left - note_room) / (max(values) or 1)
    row = (HEIGHT - TOP - BOTTOM) / len(labels)
    parts = [_title(title)]
    for i, (label, value, note) in enumerate(zip(labels, values, notes)):
        y = TOP + i * row
        bar = value * scale
        parts.append(
            f'<text x="{left - 6:.1f}" y="{y + row / 2 + 4:.1f}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{left:.1f}" y="{y + row * 0.15:.1f}" width="{bar:.1f}" height="{row * 0.7:.1f}" '
            f'fill="{colour}"/>'
            f'<text x="{left + bar:.1f}" y="{y + row / 2 + 4:.1f}" font-size="10">{escape(note)}</text>'
        )
    return "".join(parts)


def history_panel(title: str, labels: list[str], runs: list[dict]) -> str:
    """One line per funnel row over the runs (x: materialization 1..n), the legend on the right of the lines."""
    left, right, bottom = 62, WIDTH - LEGEND_WIDTH, HEIGHT - BOTTOM
    values = [r[label] for r in runs for label in labels if r.get(label) is not None]
    low, high = min(values, default=0), max(values, default=1)
    if low == high:
        low, high = low - 1, high + 1

    def x(i: int) -> float:
        return left + (right - left) * (i / (len(runs) - 1) if len(runs) > 1 else 0.5)

    def y(v: float) -> float:
        return bottom - (bottom - TOP) * (v - low) / (high - low)

    parts = [
        _title(title),
        f'<path d="M{left} {TOP}V{bottom}H{right}" stroke="#444" fill="none"/>',
        f'<text x="{left - 4}" y="{TOP + 4}" text-anchor="end" font-size="10">{high:,}</text>',
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end" font-size="10">{low:,}</text>',
        f'<text x="{(left + right) / 2}" y="{HEIGHT - 6}" text-anchor="middle">materialization</text>',
    ]
    parts += [f'<text x="{x(i):.1f}" y="{bottom + 13}" text-anchor="middle">{i + 1}</text>' for i in range(len(runs))]
    for i, label in enumerate(labels):
        colour, size = LINE_COLOURS[i % len(LINE_COLOURS)], 4 + 2.5 * (len(labels) - 1 - i)
        points = [(x(k), y(r[label])) for k, r in enumerate(runs) if r.get(label) is not None]
        dash = f' stroke-dasharray="{DASHES[i % len(DASHES)]}"' if DASHES[i % len(DASHES)] else ""
        parts.append(
            f'<g class="row" data-label="{escape(label)}" data-marker="{MARKERS[i % len(MARKERS)]}" '
            f'data-size="{size}" data-values="{",".join(str(r.get(label)) for r in runs)}">'
            f'<polyline points="{" ".join(f"{px:.1f},{py:.1f}" for px, py in points)}" fill="none" '
            f'stroke="{colour}" stroke-width="1.5"{dash}/>'
            + "".join(_marker(MARKERS[i % len(MARKERS)], px, py, size, colour) for px, py in points)
            + "</g>"
        )
        legend_y = TOP + 6 + 13 * i
        parts.append(
            f'<line x1="{right + 10}" y1="{legend_y}" x2="{right + 28}" y2="{legend_y}" stroke="{colour}"/>'
            + _marker(MARKERS[i % len(MARKERS)], right + 19, legend_y, 5, colour)
            + f'<text x="{right + 32}" y="{legend_y + 4}" font-size="10">{escape(label)}</text>'
        )
    return "".join(parts)


def language_panel(rows: tuple[LanguageCounts, ...]) -> str:
    """Tokens per language (the funnel's `languages`, most first), each bar labelled with records and tokens."""
    # (language, tokens, records tokenized) per bar
    shown = [(r.language, r.tokens, r.records_tokenized) for r in rows[:LANGUAGES_DRAWN]]
    rest = rows[LANGUAGES_DRAWN:]
    if rest:
        shown.append((f"other ({len(rest)})", sum(r.tokens for r in rest), sum(r.records_tokenized for r in rest)))
    return bar_panel(
        "tokens per language (meta.language)",
        [language for language, _, _ in shown],
        [tokens for _, tokens, _ in shown],
        [f" {tokens:,} tok, {records:,} rec" for _, tokens, records in shown],
        LANGUAGE_COLOUR,
    )


def _title(text: str) -> str:
    return f'<text x="{WIDTH / 2}" y="18" text-anchor="middle" font-size="13">{escape(text)}</text>'


def _marker(shape: str, x: float, y: float, size: float, colour: str) -> str:
    """A marker `size` px across centred on (x, y)."""
    r = size / 2
    points = {
        "square": ((-r, -r), (r, -r), (r, r), (-r, r)),
        "diamond": ((0, -r), (r, 0), (0, r), (-r, 0)),
        "triangle": ((0, -r), (r, r), (-r, r)),
        "triangle-down": ((-r, -r), (r, -r), (0, r)),
    }
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:.1f}" fill="{colour}"/>'
    if shape == "plus":
        cross = f"M{x - r:.1f} {y:.1f}h{size:.1f}M{x:.1f} {y - r:.1f}v{size:.1f}"
        return f'<path d="{cross}" stroke="{colour}" stroke-width="2"/>'
    corners = " ".join(f"{x + dx:.1f},{y + dy:.1f}" for dx, dy in points[shape])
    return f'<polygon points="{corners}" fill="{colour}"/>'
