"""Web quality and repetition rules of cleaned_jsonl (FineWeb's filters: Gopher, C4, FineWeb), and the profiles.

Profiles (`CleanSettings.quality`): 'web' runs the rules below after today's cleaning, 'curated' runs today's
cleaning only, 'auto' (the default) chooses per batch: 'web' when half or more of its records come from WARC/HTML
files or carry a URL (meta.url), else 'curated' (the choice and why: `quality_profile` in the stats).

Rules, in the order they run (each a pure function in `rules`, thresholds in `settings.QualitySettings`):

  Gopher repetition  gopher_dup_paragraphs / _paragraph_chars, gopher_dup_lines / _line_chars (share of repeated
                     paragraphs/lines, and of the characters in them), gopher_top_ngram (2-4), gopher_dup_ngram (5-10)
  Gopher quality     gopher_word_count, gopher_mean_word_length, gopher_symbol_ratio ('#', '...'),
                     gopher_bullet_lines, gopher_ellipsis_lines, gopher_alpha_words, gopher_stop_words
  C4                 lines removed (javascript, policies, under 3 words, a 1000-char word, optionally no terminal
                     punctuation), citation marks cut; documents dropped: c4_lorem_ipsum, c4_curly_bracket,
                     c4_too_few_sentences, c4_no_terminal_punct ('document' mode), c4_no_lines_left
  FineWeb            fineweb_punct_lines, fineweb_short_lines, fineweb_dup_line_chars, fineweb_list_like

Language: meta.language (language identification) or, without it, the script (`text.detect_script_language`);
`settings.LANGUAGES` says how each language is cut into words and which rules are off for it.

Where they run: in pass 1, after the garbage filters, on every record of a web batch (`apply.check_batch`), and
again in pass 2 on the records whose boilerplate lines were stripped (`apply.recheck_record`), so every verdict
is on the text as it is written. Running them only in pass 2 would need every record's text there, while pass 2
only reads the records holding a candidate line.
"""

from tokenmill.stages.clean.quality.apply import (
    QUALITY_REASONS,
    ProfileChoice,
    c4_lines_removed,
    check_batch,
    choose_profile,
    recheck_record,
    web_verdict,
)
from tokenmill.stages.clean.quality.settings import QualitySettings

__all__ = [
    "QUALITY_REASONS",
    "ProfileChoice",
    "QualitySettings",
    "check_batch",
    "choose_profile",
    "c4_lines_removed",
    "recheck_record",
    "web_verdict",
]
