"""fastText 0.9.2's predict for a supervised softmax model of two labels with word features only (no character
n-grams, not quantized), vectorized over a batch of lines with numpy.

With two labels, softmax gives the positive label sigmoid((w_pos - w_neg) . h), h the mean of the input rows of
the line's features; that is linear in the rows, so each input row reduces once to one number,
(w_pos - w_neg) . row, and a line scores sigmoid(mean of its features' numbers). The features follow
dictionary.cc getLine: the line's tokens split on the bytes readWord splits on, the end-of-line token "</s>" last
(a token "</s>" inside the line ends it there); a token's word id if the dictionary has it (unknown ones add no
row); tokens starting with the label prefix are labels and drop out; then addWordNgrams over the remaining tokens'
hashes, "</s>" included.

A batch is one UTF-8 buffer, its lines ended by "\\n". Tokens are looked up by their bytes, packed eight to a
uint64 (a token holds no NUL, so zero padding is unambiguous), in an open-addressing table of the vocabulary, and
every hit is checked against the word's packed bytes; tokens longer than SHORT_TOKEN bytes, rare, go through a
dict. Known words' hashes are precomputed; unknown tokens are hashed column by column."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EOS = b"</s>"
EOS_CHUNK = np.uint64(int.from_bytes(EOS, "little"))
FNV_OFFSET = 2166136261
FNV_PRIME = 16777619
NGRAM_MULTIPLIER = np.uint64(116049371)
# findKBest ranks std_log(p) = log(p + 1e-5) and predictLine returns its exp, so predict's probability is p + 1e-5
PREDICT_OFFSET = 1e-5
# dictionary.cc hash: h ^ uint32_t(int8_t(byte)), so a byte >= 0x80 enters sign-extended
BYTE_TERMS = np.array([b if b < 0x80 else b | 0xFFFFFF00 for b in range(256)], dtype=np.uint32)
_BYTE_TERM_LIST = BYTE_TERMS.tolist()
# the columns of token bytes are hashed together while at least this many tokens are that long; the few longer
# tokens finish one by one, cheaper than numpy calls on a handful of values
VECTOR_MIN_TOKENS = 8

CHUNK = 8  # bytes per uint64
CHUNKS = 4
SHORT_TOKEN = CHUNKS * CHUNK  # longer tokens (and vocabulary words) are looked up in a dict
PADDING = "\0" * SHORT_TOKEN  # after the last line, so every chunk load of a short token stays inside the buffer
CHUNK_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(CHUNK)] + [(1 << 64) - 1], dtype=np.uint64)
KEY_MULTIPLIER = np.uint64(0x100000001B3)
SLOT_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the key's top bits pick the slot
EMPTY = -1

# byte classes (bit 0: readWord splits there): a token byte; a separator (" \t\v\f\r\0"); a possible first byte of
# a whitespace character str.split() splits on but readWord does not (0x1c-0x1f; U+0085, U+00A0 from 0xc2;
# U+1680 0xe1; U+2000-U+205F 0xe2; U+3000 0xe3), counted to bound a line's words; the end of a line
TOKEN_BYTE, SEPARATOR, OTHER_SPACE_LEAD, LINE_END = 0, 1, 2, 3
OTHER_SPACE_LEADS = bytes([0x1C, 0x1D, 0x1E, 0x1F, 0xC2, 0xE1, 0xE2, 0xE3])
_classes = bytearray(256)
for _byte in b" \t\v\f\r\0":
    _classes[_byte] = SEPARATOR
for _byte in OTHER_SPACE_LEADS:
    _classes[_byte] = OTHER_SPACE_LEAD
_classes[ord("\n")] = LINE_END
BYTE_CLASSES = bytes(_classes)


def fnv1a_spans(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """dictionary.cc hash (uint32) of each token data[start : start + length], column by column over the tokens
    sorted longest first."""
    count = len(starts)
    hashes = np.full(count, FNV_OFFSET, dtype=np.uint32)
    if not count:
        return hashes
    order = np.argsort(-lengths, kind="stable")
    sorted_starts, sorted_lengths = starts[order], lengths[order]
    vector_columns = int(sorted_lengths[min(VECTOR_MIN_TOKENS, count) - 1])
    # sorted_lengths descends: the tokens longer than `column` are the first `active` ones
    active_per_column = np.searchsorted(-sorted_lengths, -np.arange(vector_columns), side="left")
    for column, active in enumerate(active_per_column.tolist()):
        head = hashes[:active]
        head ^= BYTE_TERMS[data[sorted_starts[:active] + column]]
        head *= FNV_PRIME
    for i in range(min(VECTOR_MIN_TOKENS - 1, count)):
        if sorted_lengths[i] <= vector_columns:
            break
        h = int(hashes[i])
        start = int(sorted_starts[i])
        for byte in data[start + vector_columns : start + int(sorted_lengths[i])].tolist():
            h = ((h ^ _BYTE_TERM_LIST[byte]) * FNV_PRIME) & 0xFFFFFFFF
        hashes[i] = h
    out = np.empty_like(hashes)
    out[order] = hashes
    return out


def uint64_loads(buffer: bytes) -> np.ndarray:
    """The little-endian uint64 at every byte offset of `buffer` (a view: entry i holds bytes i..i+7)."""
    return np.ndarray(shape=(len(buffer) - CHUNK + 1,), dtype="<u8", buffer=buffer, strides=(1,))


def chunk(loads: np.ndarray, starts: np.ndarray, lengths: np.ndarray, index: int) -> np.ndarray:
    """Bytes 8 * index to 8 * index + 7 of each token, zero-padded (0 past its end)."""
    offset = CHUNK * index
    return loads[starts + offset] & CHUNK_MASKS[np.clip(lengths - offset, 0, CHUNK)]


def chunk_keys(loads: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first chunk of each token of at most SHORT_TOKEN bytes, and a hash of all its chunks."""
    first = chunk(loads, starts, lengths, 0)
    keys = first.copy()
    for index in range(1, CHUNKS):
        longer = np.flatnonzero(lengths > CHUNK * index)
        if not longer.size:
            break
        keys[longer] = keys[longer] * KEY_MULTIPLIER ^ chunk(loads, starts[longer], lengths[longer], index)
    return first, keys


@dataclass
class Tokens:
    """A buffer's tokens and line ends in order: the byte offset of each, its length (0 for a line end), whether
    it is a line end, and its line."""

    starts: np.ndarray
    lengths: np.ndarray
    line_ends: np.ndarray
    lines: np.ndarray

    def select(self, keep: np.ndarray) -> Tokens:
        return Tokens(self.starts[keep], self.lengths[keep], self.line_ends[keep], self.lines[keep])

    def then(self, other: Tokens, offset: int, lines: np.ndarray) -> Tokens:
        """These tokens, then `other`'s, found `offset` bytes further on and of the lines `lines` indexes."""
        return Tokens(
            np.concatenate([self.starts, other.starts + offset]),
            np.concatenate([self.lengths, other.lengths]),
            np.concatenate([self.line_ends, other.line_ends]),
            np.concatenate([self.lines, lines[other.lines]]),
        )


def split_lines(buffer: bytes, line_count: int) -> tuple[Tokens, np.ndarray]:
    """readWord's tokens of `buffer` (`line_count` lines, each ended by "\\n", then PADDING), and per line an upper
    bound of its words as str.split() sees them: its tokens plus the bytes that may start a whitespace character
    readWord keeps in a token (each splits a token in two at most; "\\0" only joins)."""
    classes = np.frombuffer(buffer.translate(BYTE_CLASSES), dtype=np.uint8)
    change = np.diff((classes & 1).view(np.int8), prepend=np.int8(1))
    items = np.flatnonzero((change == -1) | (classes == LINE_END))
    line_ends = classes[items] == LINE_END
    words = ~line_ends
    lengths = np.zeros(len(items), dtype=np.int64)
    lengths[words] = np.flatnonzero(change == 1) - items[words]
    lines = np.cumsum(line_ends) - line_ends
    leads = np.searchsorted(items[line_ends], np.flatnonzero(classes == OTHER_SPACE_LEAD))
    bound = np.bincount(lines[words], minlength=line_count) + np.bincount(leads, minlength=line_count)
    return Tokens(items, lengths, line_ends, lines), bound


def first_words(line: str, max_tokens: int) -> str | None:
    """The first `max_tokens` of `line`'s whitespace-separated words, joined by spaces, where it has more."""
    words = line.split(None, max_tokens)
    return " ".join(words[:max_tokens]) if len(words) > max_tokens else None


class LinearFastText:
    """One number per input row of a model's softmax over two labels; `probabilities` of lines as predict gives
    them for the label at output row `positive_row`."""

    def __init__(
        self,
        words: list[bytes],
        input_matrix: np.ndarray,
        output_matrix: np.ndarray,
        positive_row: int,
        word_ngrams: int,
        bucket: int,
        label_prefix: bytes,
    ):
        difference = output_matrix[positive_row] - output_matrix[1 - positive_row]
        self.row_values = input_matrix @ difference  # float32, nwords + bucket rows
        self.nwords = len(words)
        self.word_ngrams = word_ngrams
        self.bucket = np.uint64(bucket)
        self.label_prefix = label_prefix
        self.eos_id = words.index(EOS) if EOS in words else EMPTY
        eos = np.frombuffer(EOS, dtype=np.uint8)
        self.eos_hash = fnv1a_spans(eos, np.zeros(1, dtype=np.int64), np.full(1, len(EOS)))[0]

        buffer = b"".join(words) + PADDING.encode()
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        starts = np.zeros(len(words), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        self.word_hashes = fnv1a_spans(np.frombuffer(buffer, dtype=np.uint8), starts, lengths)
        self.word_lengths = lengths
        self.long_words = {word: i for i, word in enumerate(words) if len(word) > SHORT_TOKEN}
        loads = uint64_loads(buffer)
        short = np.flatnonzero(lengths <= SHORT_TOKEN)
        self.word_chunks = np.zeros((CHUNKS, len(words)), dtype=np.uint64)
        for index in range(CHUNKS):
            self.word_chunks[index, short] = chunk(loads, starts[short], lengths[short], index)
        _, keys = chunk_keys(loads, starts[short], lengths[short])
        self._build_table(keys, short)

    def _build_table(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """An open-addressing table (linear probing, under half full) of the words `ids` by their `keys`."""
        bits = max(10, (2 * len(ids)).bit_length())
        self.slot_shift = np.uint64(64 - bits)
        self.slot_mask = (1 << bits) - 1
        self.table_keys = np.zeros(1 << bits, dtype=np.uint64)
        self.table_ids = np.full(1 << bits, EMPTY, dtype=np.int64)
        slots = ((keys * SLOT_MULTIPLIER) >> self.slot_shift).astype(np.int64)
        pending = np.arange(len(ids))
        while pending.size:
            free = np.flatnonzero(self.table_ids[slots[pending]] == EMPTY)
            # of the words wanting one free slot, the first takes it; the others probe on
            taken, first = np.unique(slots[pending[free]], return_index=True)
            self.table_keys[taken] = keys[pending[free[first]]]
            self.table_ids[taken] = ids[pending[free[first]]]
            placed = np.zeros(len(pending), dtype=bool)
            placed[free[first]] = True
            pending = pending[~placed]
            slots[pending] = (slots[pending] + 1) & self.slot_mask

    def lookup(self, buffer: bytes, loads: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The word id of each token (EMPTY where the dictionary lacks it)."""
        ids = np.full(len(starts), EMPTY, dtype=np.int64)
        short = np.flatnonzero(lengths <= SHORT_TOKEN)
        short_starts, short_lengths = starts[short], lengths[short]
        first, keys = chunk_keys(loads, short_starts, short_lengths)
        slots = ((keys * SLOT_MULTIPLIER) >> self.slot_shift).astype(np.int64)
        found = np.full(len(short), EMPTY, dtype=np.int64)
        pending = np.arange(len(short))
        while pending.size:
            table_ids = self.table_ids[slots[pending]]
            hit = self.table_keys[slots[pending]] == keys[pending]
            found[pending[hit]] = table_ids[hit]
            pending = pending[~hit & (table_ids != EMPTY)]
            slots[pending] = (slots[pending] + 1) & self.slot_mask
        # the key hashes the chunks: a hit counts where the token's bytes are the word's
        hits = np.flatnonzero(found != EMPTY)
        words, hit_lengths = found[hits], short_lengths[hits]
        same = (self.word_lengths[words] == hit_lengths) & (self.word_chunks[0, words] == first[hits])
        for index in range(1, CHUNKS):
            longer = np.flatnonzero(same & (hit_lengths > CHUNK * index))
            at = hits[longer]
            same[longer] = self.word_chunks[index, words[longer]] == chunk(
                loads, short_starts[at], short_lengths[at], index
            )
        ids[short[hits[same]]] = words[same]
        if self.long_words:
            for i in np.flatnonzero(lengths > SHORT_TOKEN).tolist():
                start = int(starts[i])
                ids[i] = self.long_words.get(buffer[start : start + int(lengths[i])], EMPTY)
        return ids

    def tokens(self, lines: list[str], max_tokens: int) -> tuple[bytes, Tokens]:
        """The batch's buffer and readWord's tokens of each line cut to its first `max_tokens` words."""
        buffer = ("\n".join(lines) + "\n" + PADDING).encode("utf-8")
        tokens, bound = split_lines(buffer, len(lines))
        cut = {}
        for i in np.flatnonzero(bound > max_tokens).tolist():
            if (first := first_words(lines[i], max_tokens)) is not None:
                cut[i] = first
        if not cut:
            return buffer, tokens
        more = ("\n".join(cut.values()) + "\n" + PADDING).encode("utf-8")
        cut_tokens, _ = split_lines(more, len(cut))
        cut_lines = np.fromiter(cut, dtype=np.int64, count=len(cut))
        kept = tokens.select(~np.isin(tokens.lines, cut_lines))
        return buffer + more, kept.then(cut_tokens, len(buffer), cut_lines)

    def labels(self, buffer: bytes, tokens: Tokens) -> np.ndarray:
        """Whether each token starts with the label prefix."""
        at = []
        start = buffer.find(self.label_prefix)
        while start >= 0:
            at.append(start)
            start = buffer.find(self.label_prefix, start + 1)
        return np.isin(tokens.starts, at) & ~tokens.line_ends

    def probabilities(self, lines: list[str], max_tokens: int) -> np.ndarray:
        """predict's probability of the positive label for each line (no "\\n" in one) cut to its first
        `max_tokens` words (float64; 0 for a line with no features)."""
        buffer, tokens = self.tokens(lines, max_tokens)
        data, loads = np.frombuffer(buffer, dtype=np.uint8), uint64_loads(buffer)
        if self.label_prefix in buffer:
            tokens = tokens.select(~self.labels(buffer, tokens))
        words = np.flatnonzero(~tokens.line_ends)
        starts, lengths = tokens.starts[words], tokens.lengths[words]
        word_ids = self.lookup(buffer, loads, starts, lengths)
        ids = np.full(len(tokens.starts), self.eos_id, dtype=np.int64)
        ids[words] = word_ids
        hashes = np.full(len(tokens.starts), self.eos_hash, dtype=np.uint32)
        known = word_ids != EMPTY
        hashes[words[known]] = self.word_hashes[word_ids[known]]
        unknown = words[~known]
        hashes[unknown] = fnv1a_spans(data, tokens.starts[unknown], tokens.lengths[unknown])
        lines_of = tokens.lines
        # getLine stops at a token "</s>" inside a line as at its end
        four = words[lengths == len(EOS)]
        inner_ends = four[chunk(loads, tokens.starts[four], tokens.lengths[four], 0) == EOS_CHUNK]
        if inner_ends.size:
            ends = np.union1d(np.flatnonzero(tokens.line_ends), inner_ends)
            end_lines, first = np.unique(lines_of[ends], return_index=True)
            first_end = np.empty(len(lines), dtype=np.int64)
            first_end[end_lines] = ends[first]
            keep = np.arange(len(ids)) <= first_end[lines_of]
            ids, hashes, lines_of = ids[keep], hashes[keep], lines_of[keep]
        return self.mean_sigmoid(ids, hashes, lines_of, len(lines))

    def mean_sigmoid(self, ids: np.ndarray, hashes: np.ndarray, lines_of: np.ndarray, count: int) -> np.ndarray:
        """predict's probability per line from its tokens' word ids (EMPTY: unknown) and hashes, line by line."""
        known = ids != EMPTY
        sums = np.bincount(lines_of[known], weights=self.row_values[ids[known]], minlength=count)
        features = np.bincount(lines_of[known], minlength=count)
        # addWordNgrams keeps the hashes as int32 and widens them to uint64, sign-extending
        signed = hashes.view(np.int32).astype(np.int64).view(np.uint64)
        gram = signed
        for n in range(2, self.word_ngrams + 1):
            gram = gram[:-1] * NGRAM_MULTIPLIER + signed[n - 1 :]
            first = lines_of[: len(gram)]
            within = first == lines_of[n - 1 :]
            rows = (gram[within] % self.bucket).astype(np.int64) + self.nwords
            sums += np.bincount(first[within], weights=self.row_values[rows], minlength=count)
            features += np.bincount(first[within], minlength=count)
        mean = np.divide(sums, features, out=np.zeros(count), where=features > 0)
        return np.where(features > 0, 1 / (1 + np.exp(-mean)) + PREDICT_OFFSET, 0.0)


def linear_fasttext(model, labels: list[str], positive: str) -> LinearFastText | None:
    """The linear form of `model` (fasttext_pybind's fasttext, as _FastText(...).f holds it) where predict is the
    sigmoid above: supervised, softmax loss, two labels, no character n-grams (maxn 0), not quantized (a quantized
    model also prunes its n-gram rows); None for any other model."""
    from fasttext.FastText import loss_name, model_name

    args = model.getArgs()
    if (
        model.isQuant()
        or args.model != model_name.supervised
        or args.loss != loss_name.softmax
        or args.maxn > 0
        or len(labels) != 2
    ):
        return None
    # surrogateescape: every word's bytes come back exactly, valid UTF-8 or not
    words = [word.encode("utf-8", "surrogateescape") for word in model.getVocab("surrogateescape")[0]]
    # np.asarray views the C++ matrices (np.array(copy=False), which the wrapper's getters use, fails on numpy 2)
    input_matrix, output_matrix = np.asarray(model.getInputMatrix()), np.asarray(model.getOutputMatrix())
    if input_matrix.shape[0] != len(words) + args.bucket or output_matrix.shape[0] != 2:
        return None
    return LinearFastText(
        words,
        input_matrix,
        output_matrix,
        labels.index(positive),
        args.wordNgrams,
        args.bucket,
        args.label.encode("utf-8"),
    )
