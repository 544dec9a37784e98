"""Near-dedup primitives, all numpy: shingle hashes, MinHash signatures, LSH banding, exact Jaccard, union-find.

Signatures are bit-identical to `datasketch.MinHash` (2.x, default scheme "affine32") built with the same
`num_perm`, `seed` and `hashfunc=shingle_hash32` and updated with the same shingles (`shingles()`), so a
signature saved by this module can be wrapped as
`datasketch.MinHash(num_perm, seed, hashfunc=shingle_hash32, hashvalues=sig, scheme="affine32")`
and used with `MinHashLSH` / `MinHashLSHEnsemble`. datasketch accepts any `hashfunc`; the default one
(`sha1_hash32`, one hashlib call per shingle) is what makes it slow, so the fast path here hashes every
shingle of a batch at once from the UTF-32 code points (`shingle_hashes`), and `shingle_hash32` is the same
function for one shingle in plain Python. `hash_name="sha1"` selects datasketch's default hash instead
(exactly `datasketch.hashfunc.sha1_hash32`, slower) for sketches that must match stock datasketch.

No dagster import here: these run in spawned worker processes.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
from collections.abc import Iterable, Sequence

import numpy as np

M64 = (1 << 64) - 1
# Polynomial shingle hash over code points: h = ((SEED * P + c0) * P + c1) ... mod 2^64, then the
# MurmurHash3 64-bit finalizer, then the high 32 bits (datasketch's affine32 scheme takes 32-bit input).
_POLY_SEED = 0x9E3779B97F4A7C15
_POLY_P = 0x100000001B3  # FNV-1 64-bit prime: odd, so the step is a bijection mod 2^64
_FMIX64 = (33, 0xFF51AFD7ED558CCD, 33, 0xC4CEB9FE1A85EC53, 33)
_FMIX32 = (16, 0x85EBCA6B, 13, 0xC2B2AE35, 16)
MAX_HASH32 = np.uint32(0xFFFFFFFF)

# ------------------------------------------------------------------------------------------------
# Shingles and their hashes
# ------------------------------------------------------------------------------------------------


def ngram_size(length: int, ngram: int, bounds: Sequence[int]) -> int:
    """Shingle size for a key of `length` units (code points, or words): `ngram` when fixed (> 0), else by
    length: 2 below bounds[0], 3 below bounds[1], else 5 (see DedupSettings.ngram)."""
    if ngram > 0:
        return ngram
    if length < bounds[0]:
        return 2
    if length < bounds[1]:
        return 3
    return 5


WORD = 0x80  # flag of a shingle code (item_n, band salt) for word shingles; the low bits hold the size


def shingle_code(n: int, by_word: bool) -> int:
    """The one-byte code of a shingle kind: n characters, or n words with the WORD flag (n <= 64)."""
    return WORD | n if by_word else n


def shingle_kind(code: int) -> tuple[int, bool]:
    """(size, by_word) of a shingle code."""
    return code & ~WORD, bool(code & WORD)


def shingle_label(code: int) -> str:
    n, by_word = shingle_kind(code)
    return f"{n} {'words' if by_word else 'chars'}"


def word_shingles(key: str, n: int) -> list[str]:
    """Word n-grams of a spaced key (words joined by single spaces, see keys.dedup_key) in order, each the key's
    substring from its first word to its last; a key of fewer than n words is one shingle; an empty key has none."""
    if not key:
        return []
    words = key.split(" ")
    if len(words) <= n:
        return [key]
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def shingles(key: str, n: int) -> list[str]:
    """Character n-grams of the key in order (duplicates kept, as a user feeds datasketch);
    a key shorter than n is one shingle; an empty key has none."""
    if not key:
        return []
    if len(key) <= n:
        return [key]
    return [key[i : i + n] for i in range(len(key) - n + 1)]


def _fmix64_int(h: int) -> int:
    s1, m1, s2, m2, s3 = _FMIX64
    h ^= h >> s1
    h = (h * m1) & M64
    h ^= h >> s2
    h = (h * m2) & M64
    return h ^ (h >> s3)


def shingle_hash32(shingle: str | bytes) -> int:
    """The 32-bit shingle hash (pass as `hashfunc` to datasketch.MinHash): polynomial over the code
    points mod 2^64, MurmurHash3 fmix64, high 32 bits. Accepts str or UTF-8 bytes."""
    if isinstance(shingle, (bytes, bytearray, memoryview)):
        shingle = bytes(shingle).decode("utf-8")
    h = _POLY_SEED
    for ch in shingle:
        h = (h * _POLY_P + ord(ch)) & M64
    return _fmix64_int(h) >> 32


def sha1_hash32(shingle: str | bytes) -> int:
    """datasketch's default hashfunc (first 4 bytes of SHA-1, little-endian); str is UTF-8 encoded."""
    if isinstance(shingle, str):
        shingle = shingle.encode("utf-8")
    return struct.unpack("<I", hashlib.sha1(shingle).digest()[:4])[0]


HASHFUNCS = {"poly": shingle_hash32, "sha1": sha1_hash32}


def _fmix64_np(h: np.ndarray) -> np.ndarray:
    s1, m1, s2, m2, s3 = (np.uint64(x) for x in _FMIX64)
    h = h ^ (h >> s1)
    h *= m1
    h ^= h >> s2
    h *= m2
    h ^= h >> s3
    return h


def fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3 32-bit finalizer on a uint32 array (what datasketch's affine32 scheme applies first)."""
    s1, m1, s2, m2, s3 = (np.uint32(x) for x in _FMIX32)
    h = h ^ (h >> s1)
    h *= m1
    h ^= h >> s2
    h *= m2
    return h ^ (h >> s3)


def _shingle_offsets(units: np.ndarray, n: int) -> np.ndarray:
    """Where each key's shingles start (len(units)+1): units - n + 1 windows of n units, or one shingle (the whole
    key) when it is shorter, none when it is empty."""
    counts = np.where(units >= n, units - n + 1, np.minimum(units, 1))
    offsets = np.zeros(len(units) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _sha1_hashes(keys: Sequence[str], n: int, split, offsets: np.ndarray, hash_name: str) -> np.ndarray:
    """hash_name="sha1": each shingle of `split(key, n)` hashed with hashlib (slow, datasketch's default)."""
    if hash_name != "sha1":
        raise ValueError(f"unknown shingle hash {hash_name!r} (poly or sha1)")
    return np.fromiter((sha1_hash32(s) for k in keys for s in split(k, n)), dtype=np.uint32, count=int(offsets[-1]))


def shingle_hashes(keys: Sequence[str], n: int, hash_name: str = "poly") -> tuple[np.ndarray, np.ndarray]:
    """All shingle hashes of `keys` for shingle size n: (hashes uint32, offsets int64 of len(keys)+1).

    Vectorized over the whole batch for hash_name="poly" (equal to `shingle_hash32` per shingle);
    hash_name="sha1" hashes each shingle with hashlib (slow, equal to datasketch's default).
    """
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    offsets = _shingle_offsets(lengths, n)
    if hash_name != "poly":
        return _sha1_hashes(keys, n, shingles, offsets, hash_name), offsets
    out = np.empty(int(offsets[-1]), dtype=np.uint32)
    cps = np.frombuffer("".join(keys).encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    full = lengths >= n
    n_windows = len(cps) - n + 1
    if full.any() and n_windows > 0:
        # rolling polynomial over every window of the concatenation, then keep the windows that lie
        # inside one document (in order: documents, then positions)
        with np.errstate(over="ignore"):
            h = cps[:n_windows] + np.uint64((_POLY_SEED * _POLY_P) & M64)
            for j in range(1, n):
                h *= np.uint64(_POLY_P)
                h += cps[j : j + n_windows]
        inside = np.ones(len(cps), dtype=bool)
        ends = np.cumsum(lengths)
        for k in range(1, n):  # the last n-1 start positions of each document cross its end
            e = ends - k
            inside[e[(e >= 0) & (lengths >= k)]] = False
        inside = inside[:n_windows]
        dest = np.ones(len(out), dtype=bool)
        dest[offsets[:-1][~full & (lengths > 0)]] = False
        h = _fmix64_np(h[inside])
        h >>= np.uint64(32)
        out[dest] = h
    for i in np.flatnonzero(~full & (lengths > 0)):  # keys shorter than n: one shingle, the key
        out[offsets[i]] = shingle_hash32(keys[int(i)])
    return out, offsets


def _powers(base: int, n: int) -> np.ndarray:
    """base**k mod 2^64 for k in 0..n-1."""
    out = np.full(n, np.uint64(base), dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(out, dtype=np.uint64)


def word_shingle_hashes(keys: Sequence[str], n: int, hash_name: str = "poly") -> tuple[np.ndarray, np.ndarray]:
    """All word-shingle hashes of spaced `keys` (`word_shingles`, each hashed with shingle_hash32): (hashes uint32,
    offsets int64 of len(keys)+1). Vectorized for hash_name="poly": the polynomial of a substring [i, j) is
    SEED * P^(j-i) + P^(j-1) * (S[j] - S[i]) with S[k] = sum_{m<k} c_m P^-m (P is odd, so invertible mod 2^64)."""
    words = np.fromiter((k.count(" ") + 1 if k else 0 for k in keys), dtype=np.int64, count=len(keys))
    offsets = _shingle_offsets(words, n)
    if hash_name != "poly":
        return _sha1_hashes(keys, n, word_shingles, offsets, hash_name), offsets
    if offsets[-1] == 0:
        return np.empty(0, dtype=np.uint32), offsets
    cps = np.frombuffer("".join(keys).encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    lengths = np.fromiter((len(k) for k in keys), dtype=np.int64, count=len(keys))
    doc_end = np.cumsum(lengths)
    doc_start = doc_end - lengths
    # word w of the concatenation spans [starts[w], ends[w]); words are numbered doc by doc
    space = np.flatnonzero(cps == 0x20)
    nonempty = lengths > 0
    starts = np.sort(np.concatenate([doc_start[nonempty], space + 1]))
    ends = np.sort(np.concatenate([doc_end[nonempty], space]))
    first_word = np.concatenate(([0], np.cumsum(words)[:-1]))
    doc = np.repeat(np.arange(len(keys)), np.diff(offsets))
    k = np.arange(int(offsets[-1])) - offsets[doc]
    lo = starts[first_word[doc] + k]
    hi = ends[first_word[doc] + np.minimum(k + n - 1, words[doc] - 1)]
    with np.errstate(over="ignore"):
        inverse = pow(_POLY_P, -1, 1 << 64)
        prefix = np.zeros(len(cps) + 1, dtype=np.uint64)
        np.cumsum(cps * _powers(inverse, len(cps)), out=prefix[1:])
        p_pow = _powers(_POLY_P, len(cps) + 1)
        h = np.uint64(_POLY_SEED) * p_pow[hi - lo] + p_pow[np.maximum(hi - 1, 0)] * (prefix[hi] - prefix[lo])
    h = _fmix64_np(h)
    h >>= np.uint64(32)
    return h.astype(np.uint32), offsets


def coded_shingle_hashes(keys: Sequence[str], code: int, hash_name: str = "poly") -> tuple[np.ndarray, np.ndarray]:
    """shingle_hashes or word_shingle_hashes, by the shingle code."""
    n, by_word = shingle_kind(code)
    return (word_shingle_hashes if by_word else shingle_hashes)(keys, n, hash_name)


# ------------------------------------------------------------------------------------------------
# MinHash signatures (datasketch affine32 scheme)
# ------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) uint32 arrays exactly as datasketch.MinHash(num_perm, seed).permutations (affine32)."""
    gen = np.random.RandomState(seed)
    a = gen.randint(0, 1 << 31, num_perm, dtype=np.uint32) * np.uint32(2) + np.uint32(1)
    b = gen.randint(0, 1 << 32, num_perm, dtype=np.uint32)
    return a, b


def signatures(
    hashes: np.ndarray, offsets: np.ndarray, num_perm: int = 128, seed: int = 1, chunk: int = 1 << 16
) -> np.ndarray:
    """MinHash signatures (docs, num_perm) uint32 of the shingle-hash runs hashes[offsets[i]:offsets[i+1]].

    min_k over shingles of a_k * fmix32(h) + b_k mod 2^32, one permutation at a time over a chunk of
    shingles (1-D, cache-sized: numpy's reduceat along rows of a 2-D block is much slower). A doc with
    no shingles gets all 0xFFFFFFFF, like an empty datasketch.MinHash.
    """
    a, b = permutations(num_perm, seed)
    n_docs = len(offsets) - 1
    sig = np.full((n_docs, num_perm), MAX_HASH32, dtype=np.uint32)
    counts = np.diff(offsets)
    nonempty = np.flatnonzero(counts > 0)
    if len(nonempty) == 0:
        return sig
    mixed = fmix32(hashes.astype(np.uint32, copy=False))
    # group whole documents into chunks of about `chunk` shingles
    doc_lo = 0
    ends = offsets[nonempty + 1]
    while doc_lo < len(nonempty):
        start = offsets[nonempty[doc_lo]]
        doc_hi = max(doc_lo + 1, int(np.searchsorted(ends, start + chunk, side="right")))
        docs = nonempty[doc_lo:doc_hi]
        stop = offsets[docs[-1] + 1]
        h = mixed[start:stop]
        seg = offsets[docs] - start
        tmp = np.empty_like(h)
        block = np.empty((num_perm, len(docs)), dtype=np.uint32)
        for k in range(num_perm):
            np.multiply(h, a[k], out=tmp)
            tmp += b[k]
            block[k] = np.minimum.reduceat(tmp, seg)
        sig[docs] = block.T
        doc_lo = doc_hi
    return sig


# ------------------------------------------------------------------------------------------------
# LSH banding
# ------------------------------------------------------------------------------------------------


def catch_probability(s: float, bands: int, rows: int) -> float:
    """Probability that a pair with Jaccard s shares at least one band: 1 - (1 - s^r)^b."""
    return 1.0 - (1.0 - s**rows) ** bands


def choose_bands(threshold: float, num_perm: int, fn_weight: float) -> tuple[int, int]:
    """(bands, rows) with bands * rows <= num_perm minimizing
    (1 - fn_weight) * P(false candidate below threshold) + fn_weight * P(missed pair above it),
    both integrated over Jaccard like datasketch's _optimal_param. Every candidate is verified
    exactly, so a false candidate costs only time: DedupSettings' weight favours recall (0.999, 128 perms:
    threshold 0.8 -> 21 x 6, 0.85 -> 18 x 7, 0.9 -> 14 x 9; 0.97, the earlier default, gave 16 x 8, which misses
    5.3% of the pairs at 0.8; datasketch's equal weights give 9 x 13 at 0.8, which catches a pair at Jaccard 0.8
    with probability 0.40)."""
    xs = np.linspace(0.0, 1.0, 2001)
    below, above = xs <= threshold, xs >= threshold
    best: tuple[float, int, int] = (np.inf, 0, 0)
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            p = 1.0 - (1.0 - xs**r) ** b
            fp = np.trapezoid(p[below], xs[below])
            fn = np.trapezoid(1.0 - p[above], xs[above])
            err = (1.0 - fn_weight) * fp + fn_weight * fn
            if err < best[0] - 1e-15:
                best = (float(err), b, r)
    return best[1], best[2]


def band_hashes(sig: np.ndarray, bands: int, rows: int, salt: np.ndarray | int = 0) -> np.ndarray:
    """(bands, items) uint64: a 64-bit hash of each band's rows per signature row, salted (e.g. by the
    shingle size, so signatures of different sizes never share a bucket). No Python object per item."""
    n = sig.shape[0]
    out = np.empty((bands, n), dtype=np.uint64)
    salt = np.asarray(salt, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(bands):
            h = (
                np.full(n, np.uint64(_POLY_SEED), dtype=np.uint64)
                ^ (salt * np.uint64(0x2545F4914F6CDD1D))
                ^ np.uint64((i + 1) * 0x632BE59BD9B4E019 & M64)
            )
            for j in range(i * rows, (i + 1) * rows):
                h ^= sig[:, j].astype(np.uint64)
                h *= np.uint64(_POLY_P)
            out[i] = _fmix64_np(h)
    return out


def pairs_per_bucket(lens: np.ndarray, max_bucket: int, neighbours: int, hubs: int = 0) -> np.ndarray:
    """Candidate pairs a bucket of each size emits at most (see bucket_pairs): all of them up to max_bucket
    members, else each member with its next `neighbours` and with each of `hubs` hubs (pairs found both ways
    are emitted once, so an oversized bucket may emit fewer)."""
    lens = np.asarray(lens, dtype=np.int64)
    w = np.minimum(neighbours, lens - 1)
    oversized = w * lens - w * (w + 1) // 2 + np.minimum(hubs, lens) * (lens - 1)
    return np.where(lens <= max_bucket, lens * (lens - 1) // 2, np.minimum(oversized, lens * (lens - 1) // 2))


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, kind="stable") of a 1-D array: numpy's default sort (several times faster than its stable one on
    64-bit keys in random order), then each run of equal keys put back in index order."""
    order = np.argsort(keys)
    ordered = keys[order]
    tie = ordered[1:] == ordered[:-1]
    if tie.any():
        at = np.flatnonzero(np.concatenate((tie, [False])) | np.concatenate(([False], tie)))
        run = np.cumsum(np.concatenate(([True], ~tie)))[at]
        order[at] = order[at][np.lexsort((order[at], run))]
    return order


def fold16(sig: np.ndarray) -> np.ndarray:
    """(items, num_perm) uint16: each signature value folded to 16 bits (what order_words packs)."""
    return (sig ^ (sig >> np.uint32(16))).astype(np.uint16)  # the cast keeps the low 16 bits


def fold8(sig: np.ndarray) -> np.ndarray:
    """(items, num_perm) uint8: each signature value (uint32, or already folded by fold16) folded to a byte (what
    the verification pre-filter compares: two equal values give equal bytes, two different ones with probability
    1/256). fold8(fold16(sig)) == fold8(sig): an index segment stores fold16 and serves both."""
    v = sig if sig.dtype == np.uint16 else fold16(sig)
    return (v ^ (v >> np.uint16(8))).astype(np.uint8)


def order_words(folded: np.ndarray, first_row: int, rows: int = 8) -> np.ndarray:
    """(items, ceil(rows / 4)) uint64: the folded signature values (fold16) of `rows` rows from `first_row` on
    (wrapping), four to a word, so sorting by the words in order sorts by those values lexicographically
    (members that agree on them, as near duplicates mostly do, sort next to each other)."""
    lanes = np.zeros((folded.shape[0], 4 * -(-rows // 4)), dtype="<u2")
    j = 0
    while j < rows:  # runs of adjacent columns: slices copy far faster than a gather of columns
        c = (first_row + j) % folded.shape[1]
        k = min(rows - j, folded.shape[1] - c)
        lanes[:, j : j + k] = folded[:, c : c + k]
        j += k
    # read as little-endian words, the lanes reversed put each word's first value in its high 16 bits
    return np.ascontiguousarray(lanes[:, ::-1]).view("<u8")[:, ::-1].astype(np.uint64)


def hub_positions(words: np.ndarray, hubs: int) -> np.ndarray:
    """Positions of the `hubs` most central rows of `words` (an oversized bucket's order words, in its sorted
    order): a member scores, over each order row, the members sharing its value there, so the copy closest to
    what a family of copies has in common scores highest; ties go to the earlier position (deterministic)."""
    lanes = np.ascontiguousarray(words).view("<u2").reshape(len(words), -1)  # the 16-bit values, any lane order
    score = np.zeros(len(words), dtype=np.int64)
    for column in lanes.T:
        _, inverse, counts = np.unique(column, return_inverse=True, return_counts=True)
        score += counts[inverse.ravel()]
    return np.argsort(-score, kind="stable")[:hubs]


def bucket_pairs(
    hashes: np.ndarray,
    members: np.ndarray,
    max_bucket: int,
    neighbours: int = 4,
    order: np.ndarray | None = None,
    hubs: int = 0,
) -> tuple[np.ndarray, dict]:
    """Candidate pairs (k, 2) int64 of `members` whose band hashes are equal, for one band.

    Sorts the hashes and walks equal runs: every pair in a run of at most max_bucket items. A larger run
    (a template shared by thousands of documents, low-entropy text whose minima collide, or a page copied a
    thousand times) is sorted by `order` (rows of order_words per member, outside this band; by member when
    None) and pairs each member with its next `neighbours` and with each of `hubs` hubs (hub_positions: the
    members sharing the most order-row values with the others): at most 2 * neighbours + hubs pairs per member,
    m * (neighbours + hubs) instead of m^2/2, so the pairs grow linearly with the corpus. A hub's own pairs grow
    with its bucket. Neighbours alone leave a family of copies in pieces (pairs at the threshold that sort apart
    are never compared); its hubs join them (docs/dedup-quality.md). Such runs are counted in the returned
    stats, never dropped silently.
    """
    stats = {"oversized_buckets": 0, "pairs_not_emitted": 0}
    if len(hashes) < 2:
        return np.empty((0, 2), dtype=np.int64), stats
    order_by = np.argsort(hashes, kind="stable")
    hs = hashes[order_by]
    m = members[order_by]
    brk = np.flatnonzero(hs[1:] != hs[:-1]) + 1
    starts = np.concatenate(([0], brk))
    lens = np.diff(np.concatenate((starts, [len(hs)])))
    out = []
    two = starts[lens == 2]
    if len(two):
        out.append(np.stack([m[two], m[two + 1]], axis=1))
    for s, L in zip(starts[lens > 2].tolist(), lens[lens > 2].tolist()):
        run = m[s : s + L]
        if L <= max_bucket:
            i, j = np.triu_indices(L, 1)
            out.append(np.stack([run[i], run[j]], axis=1))
            continue
        stats["oversized_buckets"] += 1
        words = order[order_by[s : s + L]] if order is not None else np.empty((L, 0), dtype=np.uint64)
        by_order = np.lexsort((run, *words.T[::-1]))
        run, words = run[by_order], words[by_order]
        w = min(neighbours, L - 1)
        found = [np.stack([run[:-k], run[k:]], axis=1) for k in range(1, w + 1)]
        if hubs and words.shape[1]:
            found.extend(np.stack([np.full(L, run[h]), run], axis=1) for h in hub_positions(words, hubs).tolist())
        found = [unique_pairs(np.concatenate(found))] if hubs else found  # a hub's pairs with its neighbours
        out.extend(found)
        stats["pairs_not_emitted"] += L * (L - 1) // 2 - sum(len(f) for f in found)
    if not out:
        return np.empty((0, 2), dtype=np.int64), stats
    return np.concatenate(out).astype(np.int64), stats


def unique_pairs(pairs: np.ndarray) -> np.ndarray:
    """Pairs normalized to (low, high), self-pairs dropped, sorted and unique."""
    if len(pairs) == 0:
        return pairs.reshape(0, 2).astype(np.int64)
    lo = np.minimum(pairs[:, 0], pairs[:, 1])
    hi = np.maximum(pairs[:, 0], pairs[:, 1])
    keep = lo != hi
    p = np.unique(np.stack([lo[keep], hi[keep]], axis=1), axis=0)
    return p.astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Verification and clustering
# ------------------------------------------------------------------------------------------------


def shingle_set(key: str, n: int) -> np.ndarray:
    """The distinct shingles of `key` as a sorted array, exactly (no hashing): n <= 3 code points packed
    into one uint64 (21 bits each), longer shingles as raw UTF-32 bytes (void dtype). Far smaller than
    a Python set of strings, which matters when many documents are candidates."""
    cps = np.frombuffer(key.encode("utf-32-le"), dtype="<u4")
    if 0 < len(cps) < n:  # the whole key is the one shingle, zero-padded (NUL never survives the key)
        cps = np.concatenate([cps, np.zeros(n - len(cps), dtype="<u4")])
    m = max(len(cps) - n + 1, 0)
    if n <= 3:
        packed = np.zeros(m, dtype=np.uint64)
        for j in range(n):
            packed <<= np.uint64(21)
            packed |= cps[j : j + m]
        packed.sort()
        return packed[np.concatenate(([True], packed[1:] != packed[:-1]))] if m else packed
    win = np.empty((m, n), dtype="<u4")
    for j in range(n):
        win[:, j] = cps[j : j + m]
    return np.unique(win.view(np.dtype((np.void, 4 * n))).ravel())


def coded_shingle_set(key: str, code: int) -> np.ndarray:
    """The distinct shingles of `key` for a shingle code, sorted: shingle_set for characters, the word shingles
    themselves (a str array, compared exactly) for words."""
    n, by_word = shingle_kind(code)
    return np.unique(np.asarray(word_shingles(key, n), dtype=str)) if by_word else shingle_set(key, n)


def jaccard(a, b) -> float:
    """Exact Jaccard of two shingle sets: Python sets, or sorted unique arrays from shingle_set
    (two empty sets: 1.0)."""
    if isinstance(a, np.ndarray):
        if len(a) == 0 and len(b) == 0:
            return 1.0
        inter = len(np.intersect1d(a, b, assume_unique=True))
        return inter / (len(a) + len(b) - inter)
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


class UnionFind:
    """Array union-find over 0..n-1 (path halving, union by smaller root id, so results are
    deterministic: a component's root is its smallest member)."""

    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return int(x)

    def union(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return False
        if rb < ra:
            ra, rb = rb, ra
        self.parent[rb] = ra
        return True

    def union_pairs(self, pairs: Iterable[tuple[int, int]]) -> None:
        for a, b in pairs:
            self.union(int(a), int(b))

    def roots(self) -> np.ndarray:
        """Root (smallest member) of every element, vectorized pointer jumping."""
        p = self.parent.copy()
        while True:
            q = p[p]
            if np.array_equal(q, p):
                return p
            p = q


_NATURAL = re.compile(r"(\d+)")


def natural_key(path: str) -> tuple:
    """Sort key that orders 'poet.tang.2000.json' before 'poet.tang.10000.json'."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in _NATURAL.split(path) if t)
