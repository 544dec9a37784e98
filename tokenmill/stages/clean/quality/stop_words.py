"""Stop words per language for the Gopher stop-word rule (a document must hold a few of them).

English is Gopher's own list (Rae et al. 2021, "Scaling Language Models", appendix A.1.1). The others are the
`stopwords` of FineWeb-2's per-language configs (github.com/huggingface/fineweb-2, configs/<lang>_<script>.yml,
Apache-2.0: STOP_WORDS_LICENSE beside this file), the words most frequent in each language's reference corpus.
Chinese and Japanese keep their one-character entries: their texts are counted in characters.
"""

from __future__ import annotations

STOP_WORDS: dict[str, frozenset[str]] = {
    "en": frozenset("the be to of and that have with".split()),
    "de": frozenset("der und die in von im den des mit das er dem als wurde für".split()),
    "fr": frozenset("de la le et à en l' des du les est d' un une il dans par au".split()),
    "es": frozenset("de la en el y a que del los se por un con una las su".split()),
    "it": frozenset("di e il la in a del che è della un per nel l' con da i una".split()),
    "pt": frozenset("de a e o em do da que um no uma com para na é foi".split()),
    "nl": frozenset("de van in het een en is op voor met door zijn werd hij uit".split()),
    "ru": frozenset("в и на с года по году из был к не от что за для его как а он также до после".split()),
    "pl": frozenset("w i na z do się roku od a jest przez po jako oraz o został był nie".split()),
    "zh": frozenset("的年在月是和日了於為有被人中为他與後也而由"),
    "ja": frozenset("のにをはたてがとで年しれさ"),
}
ANY_LANGUAGE: frozenset[str] = frozenset().union(
    *(words for lang, words in STOP_WORDS.items() if lang not in ("zh", "ja"))
)
"""For a text in a space-separated script whose language is not known: the stop words of every language above."""
