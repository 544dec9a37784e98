"""fastText 0.9.2's predict for a supervised softmax model of two labels with word features only (no character
n-grams, not quantized), vectorized over a batch of lines with numpy.

With two labels, softmax gives the positive label sigmoid((w_pos - w_neg) . h), h the mean of the input rows of
the line's features; that is linear in the rows, so each input row reduces once to one number,
(w_pos - w_neg) . row, and a line scores sigmoid(mean of its features' numbers). The features follow
dictionary.cc getLine: the line's tokens split on the bytes readWord splits on, the end-of-line token "</s>" last
(a token "</s>" inside the line ends it there); a token's word id if the dictionary has it (unknown ones add no
row); tokens starting with the label prefix are labels and drop out; then addWordNgrams over the remaining tokens'
hashes, "</s>" included.

A batch is one UTF-8 buffer, its lines ended by "\\n"; its tokens and line ends ("</s>") are one sequence, line
after line. Tokens are looked up in an open-addressing table of the vocabulary by a uint64 key: a token of at most
eight bytes is its own key (it holds no NUL, so zero padding is unambiguous), a longer one's hits are checked
against the word's packed bytes, and tokens longer than SHORT_TOKEN bytes, rare, go through a dict. A table slot
holds its word's row value and hash, so a known token costs one gather for each; unknown tokens are hashed column
by column. A line's sum is one reduceat over its items' numbers, each n-gram's added to its first item's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
LONG_KEY_OF_ZERO = np.uint64(1 << 8)  # a long token's key whose hash shifted to 0: still not an empty slot

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
ASCII_OTHER_SPACES = OTHER_SPACE_LEADS[:4]


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


def widened(hashes: np.ndarray) -> np.ndarray:
    """uint32 hashes as addWordNgrams widens them: it keeps them as int32 and widens those to uint64,
    sign-extending."""
    return hashes.view(np.int32).astype(np.int64).view(np.uint64)


def uint64_loads(buffer: bytes) -> np.ndarray:
    """The little-endian uint64 at every byte offset of `buffer` (a view: entry i holds bytes i..i+7)."""
    return np.ndarray(shape=(len(buffer) - CHUNK + 1,), dtype="<u8", buffer=buffer, strides=(1,))


def chunk(loads: np.ndarray, starts: np.ndarray, lengths: np.ndarray, index: int) -> np.ndarray:
    """Bytes 8 * index to 8 * index + 7 of each token, zero-padded (0 past its end)."""
    offset = CHUNK * index
    return loads[starts + offset] & CHUNK_MASKS[np.clip(lengths - offset, 0, CHUNK)]


def item_keys(loads: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each token's table key, and which tokens are longer than CHUNK. A token of at most CHUNK bytes is its own
    key: its first byte is not NUL, so the key's low byte is not 0. A longer one's key is a hash of its first
    SHORT_TOKEN bytes with a low byte of 0, so a short token never meets a longer word and needs no check."""
    keys = loads[starts] & CHUNK_MASKS[np.minimum(lengths, CHUNK)]
    long = np.flatnonzero(lengths > CHUNK)
    if long.size:
        long_starts, long_lengths = starts[long], lengths[long]
        hashed = keys[long]
        for index in range(1, CHUNKS):
            hashed = hashed * KEY_MULTIPLIER ^ chunk(loads, long_starts, long_lengths, index)
        hashed <<= np.uint64(8)
        hashed[hashed == 0] = LONG_KEY_OF_ZERO
        keys[long] = hashed
    return keys, long


def line_buffer(lines: list[str]) -> bytes:
    """`lines`, each ended by "\\n", after a separator (so a token starts only after a separator) and before
    PADDING, in one join."""
    return "\n".join(["\0" + lines[0], *lines[1:], PADDING]).encode("utf-8")


def split_lines(buffer: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """readWord's tokens of a line_buffer and its line ends in order: each one's byte offset, its length (0 for a
    line end), the indexes of the line ends, and the buffer's byte classes."""
    classes = np.frombuffer(buffer.translate(BYTE_CLASSES), dtype=np.uint8)
    separators = classes & 1
    # the buffer starts and ends with separators: the changes alternate between a token's start and its end
    changes = np.flatnonzero(separators[1:] != separators[:-1])
    token_starts = changes[0::2] + 1
    newlines = np.flatnonzero(classes == LINE_END)
    before = np.searchsorted(token_starts, newlines)
    starts = np.insert(token_starts, before, newlines)
    lengths = np.insert(changes[1::2] - changes[0::2], before, 0)
    return starts, lengths, before + np.arange(len(newlines)), classes


def first_words(line: str, max_tokens: int) -> str | None:
    """The first `max_tokens` of `line`'s whitespace-separated words, joined by spaces, where it has more."""
    words = line.split(None, max_tokens)
    return " ".join(words[:max_tokens]) if len(words) > max_tokens else None


@dataclass
class Items:
    """A batch's tokens and line ends, line by line: each one's byte offset and length (0 for a line end), the
    indexes of the line ends (each the last item of its line), and the line of each of these runs (None: in
    order)."""

    starts: np.ndarray
    lengths: np.ndarray
    ends: np.ndarray
    order: np.ndarray | None = None

    def select(self, keep: np.ndarray) -> Items:
        """The items `keep` marks, where every line keeps its end."""
        lengths = self.lengths[keep]
        return Items(self.starts[keep], lengths, np.flatnonzero(lengths == 0), self.order)


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
        # nwords + bucket rows (float32), then a row of 0 for the n-grams across two lines
        self.row_values = np.append(input_matrix @ difference, np.float32(0))
        self.zero_row = len(self.row_values) - 1
        self.nwords = len(words)
        self.word_ngrams = word_ngrams
        self.bucket = np.uint64(bucket)
        self.label_prefix = label_prefix
        eos = np.frombuffer(EOS, dtype=np.uint8)
        self.eos_hash = widened(fnv1a_spans(eos, np.zeros(1, dtype=np.int64), np.full(1, len(EOS))))[0]

        buffer = b"".join(words) + PADDING.encode()
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        starts = np.zeros(len(words), dtype=np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        word_hashes = fnv1a_spans(np.frombuffer(buffer, dtype=np.uint8), starts, lengths)
        self.word_lengths = lengths
        loads = uint64_loads(buffer)
        short = np.flatnonzero(lengths <= SHORT_TOKEN)
        self.word_chunks = np.zeros((CHUNKS, len(words)), dtype=np.uint64)
        for index in range(CHUNKS):
            self.word_chunks[index, short] = chunk(loads, starts[short], lengths[short], index)
        keys, _ = item_keys(loads, starts[short], lengths[short])
        self._build_table(keys, short)
        # after the table's slots: a slot for the tokens the dictionary lacks, then one per long word
        long_ids = [i for i, word in enumerate(words) if len(word) > SHORT_TOKEN]
        self.miss = len(self.table_keys)
        self.long_words = {words[i]: self.miss + 1 + n for n, i in enumerate(long_ids)}
        slot_ids = np.concatenate([self.table_ids, [EMPTY], long_ids]).astype(np.int64)
        known = slot_ids != EMPTY
        # per slot what a token found there adds: its word's row value (0 for none) and widened hash
        self.slot_values = np.where(known, self.row_values[np.maximum(slot_ids, 0)], np.float32(0))
        self.slot_hashes = widened(np.where(known, word_hashes[np.maximum(slot_ids, 0)], 0).astype(np.uint32))

    def save(self, out) -> None:
        """Everything scoring reads, as one .npz (no pickle) into the binary file `out`: a few bytes per row of the
        model, where the model itself holds `dim` floats per row (100: 800 MB for DCLM's 2M buckets)."""
        long_words = sorted(self.long_words.items(), key=lambda kv: kv[1])
        arrays: dict[str, Any] = {
            **{name: np.asarray(getattr(self, name)) for name in _ARRAYS},
            **{name: np.asarray(getattr(self, name), dtype=np.uint64) for name in _NUMBERS},
            "label_prefix": np.frombuffer(self.label_prefix, dtype=np.uint8),
            "long_word_bytes": np.frombuffer(b"".join(w for w, _ in long_words), dtype=np.uint8),
            "long_word_lengths": np.array([len(w) for w, _ in long_words], dtype=np.int64),
            "long_word_slots": np.array([slot for _, slot in long_words], dtype=np.int64),
        }
        np.savez(out, allow_pickle=False, **arrays)

    @classmethod
    def load(cls, path) -> LinearFastText:
        """The form `save` wrote; ValueError, KeyError or OSError when the file is not one."""
        with np.load(path, allow_pickle=False) as saved:
            linear = cls.__new__(cls)
            for name in _ARRAYS:
                setattr(linear, name, saved[name])
            for name in _NUMBERS:
                setattr(linear, name, np.uint64(saved[name]) if name in _UINT64_NUMBERS else int(saved[name]))
            linear.label_prefix = saved["label_prefix"].tobytes()
            data = saved["long_word_bytes"].tobytes()
            ends = np.cumsum(saved["long_word_lengths"]).tolist()
            starts = [0, *ends[:-1]]
            slots = saved["long_word_slots"].tolist()
        linear.long_words = {data[a:b]: slot for a, b, slot in zip(starts, ends, slots)}
        return linear

    def _build_table(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """An open-addressing table (linear probing, under half full, key 0 empty) of the words `ids` by their
        `keys`; words placed in id order (fastText's, most frequent first), so frequent words sit in their first
        slot."""
        bits = max(10, (2 * len(ids)).bit_length())
        self.slot_shift = np.uint64(64 - bits)
        self.slot_mask = (1 << bits) - 1
        self.table_keys = np.zeros(1 << bits, dtype=np.uint64)
        self.table_ids = np.full(1 << bits, EMPTY, dtype=np.int32)
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

    def lookup(self, buffer: bytes, loads: np.ndarray, items: Items, keys: np.ndarray, long: np.ndarray) -> np.ndarray:
        """The slot of each item (`keys` from item_keys; self.miss where the dictionary lacks it)."""
        # the shifted product is below 2 ** bits: its int64 view is the slot, without a copy
        slots = ((keys * SLOT_MULTIPLIER) >> self.slot_shift).view(np.int64)
        probed = self.table_keys[slots]
        hit = probed == keys
        found = np.where(hit, slots, self.miss)
        at = np.flatnonzero(~hit & (probed != 0))
        probe = (slots[at] + 1) & self.slot_mask
        while at.size:
            probed = self.table_keys[probe]
            hit = probed == keys[at]
            found[at[hit]] = probe[hit]
            more = ~hit & (probed != 0)
            at, probe = at[more], (probe[more] + 1) & self.slot_mask
        # a long token's key hashes its bytes: a hit counts where they are the word's
        candidates = long[found[long] != self.miss]
        if candidates.size:
            ids = self.table_ids[found[candidates]]
            starts, lengths = items.starts[candidates], items.lengths[candidates]
            same = self.word_lengths[ids] == lengths
            for index in range(CHUNKS):
                same &= self.word_chunks[index, ids] == chunk(loads, starts, lengths, index)
            found[candidates[~same]] = self.miss
        if self.long_words:
            for i in np.flatnonzero(items.lengths > SHORT_TOKEN).tolist():
                start = int(items.starts[i])
                found[i] = self.long_words.get(buffer[start : start + int(items.lengths[i])], self.miss)
        return found

    def items(self, lines: list[str], max_tokens: int) -> tuple[bytes, Items]:
        """The batch's buffer and readWord's tokens of each line cut to its first `max_tokens` words."""
        buffer = line_buffer(lines)
        starts, lengths, ends, classes = split_lines(buffer)
        bound = np.diff(ends, prepend=-1) - 1
        # a byte that may start a whitespace character str.split() splits on but readWord does not splits a token
        # in two at most: with the tokens, they bound a line's words as str.split() sees them
        if not buffer.isascii() or any(byte in buffer for byte in ASCII_OTHER_SPACES):
            leads = np.flatnonzero(classes == OTHER_SPACE_LEAD)
            bound += np.bincount(np.searchsorted(starts[ends], leads), minlength=len(lines))
        cut = {}
        for i in np.flatnonzero(bound > max_tokens).tolist():
            if (first := first_words(lines[i], max_tokens)) is not None:
                cut[i] = first
        if not cut:
            return buffer, Items(starts, lengths, ends)
        more = line_buffer(list(cut.values()))
        cut_starts, cut_lengths, _, _ = split_lines(more)
        cut_lines = np.fromiter(cut, dtype=np.int64, count=len(cut))
        cut_out = np.zeros(len(lines), dtype=bool)
        cut_out[cut_lines] = True
        keep = ~np.repeat(cut_out, np.diff(ends, prepend=-1))
        lengths = np.concatenate([lengths[keep], cut_lengths])
        return buffer + more, Items(
            np.concatenate([starts[keep], cut_starts + len(buffer)]),
            lengths,
            np.flatnonzero(lengths == 0),
            np.concatenate([np.flatnonzero(~cut_out), cut_lines]),
        )

    def labels(self, buffer: bytes, items: Items) -> np.ndarray:
        """Whether each item is a token starting with the label prefix."""
        at = []
        start = buffer.find(self.label_prefix)
        while start >= 0:
            at.append(start)
            start = buffer.find(self.label_prefix, start + 1)
        return np.isin(items.starts, at) & (items.lengths > 0)

    def probabilities(self, lines: list[str], max_tokens: int) -> np.ndarray:
        """predict's probability of the positive label for each line (no "\\n" in one) cut to its first
        `max_tokens` words (float64; 0 for a line with no features)."""
        if not lines:
            return np.zeros(0)
        buffer, items = self.items(lines, max_tokens)
        data, loads = np.frombuffer(buffer, dtype=np.uint8), uint64_loads(buffer)
        if self.label_prefix in buffer:
            items = items.select(~self.labels(buffer, items))
        keys, long = item_keys(loads, items.starts, items.lengths)
        keys[items.ends] = EOS_CHUNK
        eos_items = np.flatnonzero(keys == EOS_CHUNK)
        if len(eos_items) > len(items.ends):
            # getLine stops at a token "</s>" inside a line as at its end: the line's first "</s>" ends it
            _, first = np.unique(np.searchsorted(items.ends, eos_items), return_index=True)
            keep = np.arange(len(keys)) <= np.repeat(eos_items[first], np.diff(items.ends, prepend=-1))
            keys, long = keys[keep], np.flatnonzero(items.lengths[keep] > CHUNK)
            items = Items(items.starts[keep], items.lengths[keep], np.flatnonzero(keys == EOS_CHUNK), items.order)
        found = self.lookup(buffer, loads, items, keys, long)
        hashes = self.slot_hashes[found]
        unknown = np.flatnonzero(found == self.miss)
        hashes[unknown] = widened(fnv1a_spans(data, items.starts[unknown], items.lengths[unknown]))
        hashes[items.ends] = self.eos_hash
        out = self.mean_sigmoid(self.slot_values[found], hashes, unknown, items.ends)
        if items.order is None:
            return out
        ordered = np.empty_like(out)
        ordered[items.order] = out
        return ordered

    def mean_sigmoid(self, values: np.ndarray, signed: np.ndarray, unknown: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """predict's probability per line from its items' row values (0: unknown) and widened hashes, the indexes
        of the unknown ones and of the line ends."""
        sizes = np.diff(ends, prepend=-1)
        features = sizes - np.bincount(np.searchsorted(ends, unknown), minlength=len(ends))
        # each item's number plus that of the n-grams it starts, summed line by line
        contributions = values.astype(np.float64)
        gram = signed
        for n in range(2, self.word_ngrams + 1):
            gram = gram[:-1] * NGRAM_MULTIPLIER + signed[n - 1 :]
            rows = (gram % self.bucket).view(np.int64) + self.nwords
            across = (ends[:, None] - np.arange(n - 1)).ravel()
            rows[across[(across >= 0) & (across < len(rows))]] = self.zero_row
            contributions[: len(rows)] += self.row_values[rows]
            features += np.maximum(sizes - (n - 1), 0)
        sums = np.add.reduceat(contributions, ends - sizes + 1)
        mean = np.divide(sums, features, out=np.zeros(len(ends)), where=features > 0)
        return np.where(features > 0, 1 / (1 + np.exp(-mean)) + PREDICT_OFFSET, 0.0)


# what LinearFastText.save keeps: its arrays, and its numbers (uint64 where numpy arithmetic needs them so)
_ARRAYS = ("row_values", "word_lengths", "word_chunks", "table_keys", "table_ids", "slot_values", "slot_hashes")
_UINT64_NUMBERS = ("bucket", "eos_hash", "slot_shift")
_NUMBERS = ("zero_row", "nwords", "word_ngrams", "slot_mask", "miss", *_UINT64_NUMBERS)


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
