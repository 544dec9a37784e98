"""Map-style datasets over a Store: token windows (TokenDataset) and records (RecordDataset)."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

import numpy as np
import torch

from .errors import DatasetError
from .format import PAD_TOKEN, RECORD_KEY
from .shared import _use_count
from .store import Store, open_store, to_torch

IGNORE_INDEX = -100
# the (B, seq_len) planes TokenDataset.get_batch can return, in the order they are returned
TOKEN_FIELDS = ("input_ids", "labels", "position_ids")


def dataset_version(dataset) -> int | None:
    """The version of the token dataset a loader reads (None: unversioned, or not a token dataset)."""
    return getattr(getattr(dataset, "store", None), "version", None)


def with_version(state: dict, dataset) -> dict:
    """A loader's state with the version of the dataset it was reading (unversioned datasets add nothing)."""
    version = dataset_version(dataset)
    return state if version is None else {**state, "version": version}


def check_state_version(state: dict, dataset) -> None:
    """Refuses a loader state saved while reading another version of the dataset: positions index one version's
    samples, so resuming them on another would silently skip or repeat data."""
    if "version" not in state:  # saved from an unversioned dataset, or before versions existed
        return
    saved, reading = state["version"], dataset_version(dataset)
    if saved != reading:
        store = getattr(dataset, "store", None)
        path = store.path if store is not None else "the dataset"
        raise DatasetError(
            f"{path}: the loader state was saved reading version {saved}, this loader reads version {reading}; "
            f"resume on version {saved} with open_store(path, version={saved}) (TokenDataset(path, ..., "
            f"version={saved}) / RecordDataset(path, version={saved})), or start the new version from a fresh state"
        )


def _index_dtype(token_dtype: np.dtype, vocab_size: int | None) -> np.dtype:
    """Compact signed host dtype for token ids: int32 for uint16/int32 data and for uint32 data whose vocabulary
    fits (every id read is checked against vocab_size), int64 otherwise. Half the bytes of int64 per batch: the
    batch is written once and read again by the copy to the device."""
    fits = token_dtype.itemsize <= 2 or token_dtype == np.int32 or (vocab_size is not None and vocab_size <= 2**31)
    return np.dtype(np.int32) if fits else np.dtype(np.int64)


class BufferPool:
    """Batch buffers of the reading process used again once the caller dropped every tensor of a batch. A fresh
    (3, B, L) buffer per batch is new memory whenever glibc has returned the last one to the system: a page fault
    per 4 KiB, which held the in-process loader well below its rate reusing memory (benchmarks/bench_loader_peers.py;
    docs/profile.md, 'The loader against Megatron-Core, OLMo-core and LitData'). A buffer still viewed by any tensor,
    numpy array or storage is never taken."""

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._buffers: list[tuple[torch.Tensor, int]] = []  # (buffer, use count of its storage when idle)
        self._lock = threading.Lock()

    def take(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """A tensor of `shape` and `dtype`, uninitialized: an idle buffer's memory if one fits, else new."""
        with self._lock:  # the view made under the lock counts as a use: no second caller gets the same buffer
            for buf, idle in self._buffers:
                if (
                    buf.shape == shape
                    and buf.dtype == dtype
                    and _use_count is not None  # always: buffers are kept only where uses can be counted
                    and _use_count(buf.untyped_storage()._cdata) == idle
                ):
                    return buf.detach()  # a new tensor over the buffer (a view's cost without its shape checks)
            buf = torch.empty(shape, dtype=dtype)
            if _use_count is not None and len(self._buffers) < self.keep:
                self._buffers.append((buf, _use_count(buf.untyped_storage()._cdata)))
            return buf.detach()


def _alloc(shape, dtype: np.dtype, ring=None, pool: BufferPool | None = None) -> torch.Tensor:
    """An uninitialized tensor: in a free slot of a DataLoader worker's BatchRing if it has one, else in a worker
    allocated directly in shared memory, else from the reading process's pool, else in private memory."""
    tdt = torch.int32 if dtype == np.int32 else torch.int64
    if ring is not None:
        t = ring.take(shape, tdt)
        if t is not None:
            return t
    if torch.utils.data.get_worker_info() is not None:
        n = math.prod(shape)
        try:
            storage = torch.empty(0, dtype=tdt)._typed_storage()._new_shared(n, device="cpu")
            return torch.empty(0, dtype=tdt).new(storage).view(*shape)
        except (AttributeError, RuntimeError, TypeError):  # private API moved: share after the fact
            return torch.empty(shape, dtype=tdt).share_memory_()
    if pool is not None:
        return pool.take(tuple(shape), tdt)
    return torch.empty(shape, dtype=tdt)


def _int64(obj):
    """Integer tensors (or lists of them) as int64."""
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() or obj.dtype == torch.int64:
            return obj
        if obj.device.type != "cpu":
            return obj.long()
        # numpy's cast: torch's .long() of a CPU batch is slow on busy cores (intra-op threads), numpy's is not
        return torch.from_numpy(obj.numpy().astype(np.int64))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_int64(v) for v in obj)
    return obj


def long_labels(batch):
    """A batch dict with every `*labels` entry as int64 (F.cross_entropy takes int64 targets only); other batches
    as they are."""
    if isinstance(batch, dict):
        return {k: (_int64(v) if k.endswith("labels") else v) for k, v in batch.items()}
    return batch


def _token_fields(fields) -> tuple[str, ...]:
    """`fields` as TOKEN_FIELDS names in TOKEN_FIELDS order; ValueError saying what is wrong."""
    names = (fields,) if isinstance(fields, str) else tuple(fields)
    unknown = [f for f in names if f not in TOKEN_FIELDS]
    if unknown:
        problem = f"unknown {', '.join(map(repr, unknown))}"
    elif "input_ids" not in names:
        problem = "input_ids missing (labels and position_ids come with the tokens)"
    elif len(set(names)) != len(names):
        problem = "a name given twice"
    else:
        return tuple(f for f in TOKEN_FIELDS if f in names)
    raise ValueError(
        f"TokenDataset fields={fields!r}: {problem}; fields are input_ids plus any of labels, position_ids"
    )


def batched_collate(batch):
    """collate_fn for datasets whose `__getitems__` already returns a collated batch (pass-through)."""
    return batch


class TokenDataset(torch.utils.data.Dataset):
    """Fixed-length windows over the token stream of a dataset (all shards concatenated).

    Item `i` covers stream positions [i*stride, i*stride + seq_len) and returns, all of length seq_len:

    - `input_ids`: the tokens;
    - `labels`: the same tokens where trained (loss_mask 1, or no loss_mask), -100 where masked.
      Labels are NOT shifted: the model shifts once (logits[:, :-1] against labels[:, 1:]);
    - `position_ids`: 0 at the window start and restarting at 0 at every document start inside it;
    - with `cu_seqlens=True`: `cu_seqlens` (int32 document boundaries within the window, from 0 to
      seq_len; in a batch from `get_batch` they index the flattened B*seq_len batch) and `max_seqlen`.

    `fields` names the planes returned: `input_ids` plus any of `labels` and `position_ids` (default all three,
    in that order). A trainer that shifts the tokens itself (nanoGPT-style: x, y = ids[:, :-1], ids[:, 1:])
    asks for `fields=("input_ids",)`: one (B, seq_len) plane is written instead of three (a third of the bytes;
    no labels copy, no position ids), equal to the full batch's input_ids. A loss_mask reaches the batch only
    through `labels`. `cu_seqlens=True` works with any fields.

    Window count: (total_tokens - seq_len) // stride + 1 (stride defaults to seq_len: disjoint windows;
    the tail shorter than a window is not served). Host tensors are compact: int32 ids/labels/positions
    (int64 for uint32 data without a vocab_size of at most 2**31); upcast on the device (DevicePrefetcher does).

    `get_batch(indices)` (also `__getitems__`, which torch's DataLoader calls with a batch of indices)
    reads a whole batch in one call (vectorized shard lookup, one slice copy per window) and returns
    a collated dict of (B, seq_len) tensors. With a plain torch DataLoader pass
    collate_fn=batched_collate (tokenmill_loader.DataLoader does this itself).
    """

    def __init__(
        self,
        path,
        seq_len: int,
        stride: int | None = None,
        cu_seqlens: bool = False,
        dtype=None,
        verify: bool = False,
        key: str = "sequence",
        version: int | None = None,
        fields: Sequence[str] = TOKEN_FIELDS,
    ):
        self.fields = _token_fields(fields)
        self.store: Store = open_store(path, dtype=dtype, verify=verify, version=version)
        if self.store.training_type in ("dpo", "grpo"):
            raise DatasetError(
                f"{self.store.path}: training_type {self.store.training_type} has no token stream; use RecordDataset"
            )
        self.key = key
        self.seq_len = int(seq_len)
        self.stride = int(stride or seq_len)
        if self.seq_len < 1 or self.stride < 1:
            raise ValueError("seq_len and stride must be >= 1")
        self.cu_seqlens = bool(cu_seqlens)
        self.total_tokens = self.store.num_items(key)
        self.has_mask = key == "sequence" and "loss_mask" in self.store.keys
        self.out_dtype = _index_dtype(self.store.dtypes[key], self.store.vocab_size)
        if self.total_tokens < self.seq_len:
            self.num_windows = 0
        else:
            self.num_windows = (self.total_tokens - self.seq_len) // self.stride + 1

    def __len__(self) -> int:
        return self.num_windows

    def __getstate__(self):
        state = dict(self.__dict__)
        for cache in ("_ar_slots", "_ar_ramp", "_edges"):  # rebuilt in the receiving process
            state.pop(cache, None)
        state.pop("batch_ring", None)  # a worker's own
        state.pop("_buffer_pool", None)  # this process's memory
        return state

    def batch_nbytes(self, batch_size: int) -> int:
        """Bytes of the (len(fields), batch_size, seq_len) block get_batch fills."""
        return len(self.fields) * int(batch_size) * self.seq_len * self.out_dtype.itemsize

    def shards_of(self, indices) -> np.ndarray:
        """The Store parts (shards) windows `indices` read, in their order (repeats kept): what the DataLoader's
        prefetch plan of a remote store follows."""
        return self.store.parts_of_windows(self.key, self._starts(indices), self.seq_len)

    def window(self, index: int) -> tuple[int, int]:
        """Stream range [begin, end) of window `index`."""
        b = int(index) * self.stride
        return b, b + self.seq_len

    def _starts(self, indices) -> np.ndarray:
        """Stream start of each window in `indices` (negative: from the end), int64; IndexError outside."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        if idx.size:
            # a list of ints (what DataLoader passes): Python's min and max, cheaper than numpy's two reductions at
            # small B (docs/profile.md, 'The loader against Megatron-Core, OLMo-core and LitData')
            plain = type(indices) is list and type(indices[0]) is int
            lo, hi = (min(indices), max(indices)) if plain else (idx.min(), idx.max())
            if lo < -self.num_windows or hi >= self.num_windows:
                raise IndexError(f"window index out of range (0..{self.num_windows - 1})")
            if lo < 0:
                idx = np.where(idx < 0, idx + self.num_windows, idx)
        return idx * self.stride

    def _segments(self, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(rel, lens): the segments of the batch's windows, row after row: each window's start and each document
        start strictly inside it, as offsets in the window (int64), and their lengths (0 for an empty document).
        None when no document starts inside any window."""
        L = self.seq_len
        ds = self.store.doc_starts(self.key)
        if not len(starts):
            return None
        # first document start after each window start (> s, i.e. >= s + 1) and first at or after its end
        edges = self.__dict__.get("_edges")
        if edges is None or edges[1, 0] != L:
            edges = self._edges = np.array([[1], [L]], dtype=np.int64)
        lo, hi = ds.searchsorted(starts + edges)
        per_row = hi - lo
        per_row += 1  # the window start, then its documents' starts
        ends = per_row.cumsum()
        total = int(ends[-1])
        if total == len(starts):
            return None
        # slot j of row r: ds[lo_r - 1 + j] (slot 0: any document's start, set to the window start below)
        rel = ds.take(self._arange("_ar_slots", total, np.int64) + (hi - ends).repeat(per_row))
        rel -= starts.repeat(per_row)
        rel[ends - per_row] = 0
        last = ends - 1
        lens = np.empty_like(rel)
        np.subtract(rel[1:], rel[:-1], out=lens[:-1])
        lens[last] = L - rel[last]
        return rel, lens

    def get_batch(self, indices) -> dict:
        starts = self._starts(indices)
        B, L = len(starts), self.seq_len
        # the fields share one (len(fields), B, L) buffer: one allocation, and in a worker one slot of its
        # BatchRing (or one shared-memory segment), so nothing is copied again on the way out. One field is
        # the buffer itself, (B, L): no views to make (no unbind and numpy views per batch; docs/profile.md,
        # 'The loader against Megatron-Core, OLMo-core and LitData')
        one = len(self.fields) == 1
        shape = (B, L) if one else (len(self.fields), B, L)
        buf_t = _alloc(shape, self.out_dtype, self.__dict__.get("batch_ring"), self._pool())
        planes = {"input_ids": buf_t.numpy()} if one else dict(zip(self.fields, buf_t.numpy()))
        ids = planes["input_ids"]
        self.store.gather(self.key, starts, L, out=ids, in_bounds=True)
        if "labels" in planes:
            self._fill_labels(planes["labels"], ids, starts)
        seg = self._segments(starts) if "position_ids" in planes or self.cu_seqlens else None
        if "position_ids" in planes:
            self._fill_positions(planes["position_ids"], seg)
        out: dict[str, torch.Tensor | int] = {"input_ids": buf_t} if one else dict(zip(self.fields, buf_t.unbind(0)))
        if self.cu_seqlens:
            # segment boundaries in the flattened (B*L) batch; an empty document has no segment
            if seg is None:
                cu = np.arange(B + 1, dtype=np.int64) * L
            else:
                lens = seg[1]
                cu = np.concatenate([[0], lens[lens != 0].cumsum()])
            out["cu_seqlens"] = torch.from_numpy(cu.astype(np.int32))
            out["max_seqlen"] = int(np.diff(cu).max()) if B else 0
        return out

    def _fill_labels(self, labels: np.ndarray, ids: np.ndarray, starts: np.ndarray) -> None:
        """labels = ids where trained (loss_mask 1, or no loss_mask), IGNORE_INDEX elsewhere."""
        if self.has_mask:
            mask = np.not_equal(self.store.gather("loss_mask", starts, self.seq_len, in_bounds=True), 0)
            labels.fill(IGNORE_INDEX)
            np.copyto(labels, ids, where=mask)
        else:
            np.copyto(labels, ids)

    def _fill_positions(self, pos: np.ndarray, seg: tuple[np.ndarray, np.ndarray] | None) -> None:
        """pos = the offset in the window minus the offset of its segment's start (window or document)."""
        B, L = pos.shape
        # offsets below 2**16 are computed as uint16 against one row's arange and widened as they are written
        # (half the bytes through the repeat and the subtraction; int32 over a (B*L) arange was slower at
        # L 8192 B 32, its temporaries and arange falling out of cache)
        pdt = np.dtype(np.uint16) if L <= 1 << 16 else self.out_dtype
        ramp = self._arange("_ar_ramp", L, pdt)
        if seg is None:
            np.copyto(pos, ramp)  # no document starts inside: every row 0..L-1
            return
        rel, lens = seg
        seg_start = rel.astype(pdt).repeat(lens).reshape(B, L)
        if pdt == pos.dtype:
            np.subtract(ramp, seg_start, out=pos)
        else:
            np.subtract(ramp, seg_start, out=seg_start)
            np.copyto(pos, seg_start)

    def _pool(self) -> BufferPool:
        pool = self.__dict__.get("_buffer_pool")
        if pool is None:
            pool = self._buffer_pool = BufferPool()
        return pool

    def _arange(self, name: str, n: int, dtype) -> np.ndarray:
        """arange(n) of `dtype`, kept as attribute `name` (a cache; not pickled) and grown when too short."""
        a = self.__dict__.get(name)
        if a is None or len(a) < n or a.dtype != dtype:
            a = np.arange(n, dtype=dtype)
            setattr(self, name, a)
        return a[:n]

    def __getitems__(self, indices):
        batch = self.get_batch(indices)
        ring = self.__dict__.get("batch_ring")  # attached in DataLoader workers (tokenmill_loader.DataLoader)
        return batch if ring is None else ring.pack(batch)

    def __getitem__(self, index) -> dict:
        b = self.get_batch([index])
        return {k: (v[0] if k in TOKEN_FIELDS else v) for k, v in b.items()}


class RecordDataset(torch.utils.data.Dataset):
    """One record per item, by training type (from dataset.json, else inferred from the keys).

    - seq / conditional / sft: `input_ids`, `labels` (-100 where loss_mask is 0), `position_ids`;
    - dpo: `chosen_input_ids`, `chosen_labels`, `rejected_input_ids`, `rejected_labels`
      (labels -100 on the prompt, from chosen_mask / rejected_mask);
    - grpo: `prompt_ids`, `responses` (list of tensors), `response_masks` (list, uint8),
      `response_labels` (list, -100 where masked), `rewards` (float32, one per response).

    Lengths vary: batch with PackingLoader, or DataLoader(collate_fn=pad_collate).
    """

    def __init__(self, path, dtype=None, verify: bool = False, version: int | None = None):
        self.store: Store = open_store(path, dtype=dtype, verify=verify, version=version)
        self.training_type = self.store.training_type

    def __len__(self) -> int:
        return self.store.num_records

    @property
    def pad_id(self) -> int:
        """The dataset's `<pad>` id (dataset.json special_tokens), else 0."""
        return int((self.store.info.get("special_tokens") or {}).get(PAD_TOKEN, 0))

    def shards_of(self, indices) -> np.ndarray:
        """The Store part (shard) of each record in `indices`, in their order: what the DataLoader's prefetch plan of
        a remote store follows."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        return self.store.parts_of_records(np.where(idx < 0, idx + len(self), idx))

    def lengths(self) -> np.ndarray:
        """Tokens per record (the record key: sequence, chosen or prompts), from offsets only."""
        return self.store.record_lengths(RECORD_KEY[self.training_type])

    @staticmethod
    def _labels(ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            return ids.copy()
        return np.where(mask != 0, ids, np.asarray(IGNORE_INDEX, dtype=ids.dtype))

    def __getitem__(self, index) -> dict:
        st = self.store
        tt = self.training_type
        index = int(index)
        if tt in ("seq", "conditional", "sft"):
            ids = st.read_record(index, "sequence")
            ids = ids.astype(_index_dtype(ids.dtype, st.vocab_size))
            mask = st.read_record(index, "loss_mask") if "loss_mask" in st.keys else None
            return {
                "input_ids": torch.from_numpy(ids),
                "labels": torch.from_numpy(self._labels(ids, mask)),
                "position_ids": torch.arange(len(ids), dtype=torch.int32),
            }
        if tt == "dpo":
            out = {}
            for side in ("chosen", "rejected"):
                ids = st.read_record(index, side)
                ids = ids.astype(_index_dtype(ids.dtype, st.vocab_size))
                mkey = f"{side}_mask"
                mask = st.read_record(index, mkey) if mkey in st.keys else None
                out[f"{side}_input_ids"] = torch.from_numpy(ids)
                out[f"{side}_labels"] = torch.from_numpy(self._labels(ids, mask))
            return out
        # grpo
        prompt = st.read_record(index, "prompts")
        dt = _index_dtype(prompt.dtype, st.vocab_size)
        resps = [r.astype(dt) for r in st.read_record(index, "responses")]
        masks = st.read_record(index, "masks") if "masks" in st.keys else [None] * len(resps)
        return {
            "prompt_ids": torch.from_numpy(prompt.astype(dt)),
            "responses": [torch.from_numpy(r) for r in resps],
            "response_masks": [
                torch.from_numpy(m) if m is not None else torch.ones(len(r), dtype=torch.uint8)
                for r, m in zip(resps, masks)
            ],
            "response_labels": [torch.from_numpy(self._labels(r, m)) for r, m in zip(resps, masks)],
            "rewards": to_torch(st.read_record(index, "rewards")),
        }


def _mask_key(key: str) -> str | None:
    """The attention-mask name of a padded token key: input_ids -> attention_mask,
    chosen_input_ids -> chosen_attention_mask, prompt_ids -> prompt_attention_mask; None for other keys."""
    if key.endswith("input_ids"):
        return key[: -len("input_ids")] + "attention_mask"
    if key.endswith("_ids") and "position" not in key:
        return key[: -len("ids")] + "attention_mask"
    return None


def pad_collate(samples: list[dict], pad_id: int = 0) -> dict:
    """Pad a list of variable-length 1-D samples into (B, Lmax) tensors, with an attention mask per token key.

    `labels` pad with -100, `position_ids` with 0, float tensors (grpo `rewards`) with NaN so padding never
    reads as a real value, every other 1-D tensor with `pad_id` (RecordDataset gives the dataset's `<pad>`).
    Each token key gets its mask (`input_ids` -> `attention_mask`, `chosen_input_ids` ->
    `chosen_attention_mask`, `prompt_ids` -> `prompt_attention_mask`); lists and other values stay lists.
    """
    out: dict[str, torch.Tensor | list] = {}
    for k in samples[0]:
        vals = [s[k] for s in samples]
        if all(isinstance(v, torch.Tensor) and v.dim() == 1 for v in vals):
            lmax = max(len(v) for v in vals)
            fill: float
            if "labels" in k:
                fill = IGNORE_INDEX
            elif "position" in k:
                fill = 0
            elif vals[0].is_floating_point():
                fill = float("nan")
            else:
                fill = pad_id
            t = torch.full((len(vals), lmax), fill, dtype=vals[0].dtype)
            for i, v in enumerate(vals):
                t[i, : len(v)] = v
            out[k] = t
            mask_key = _mask_key(k)
            if mask_key is not None:
                lengths = torch.tensor([len(v) for v in vals])
                out[mask_key] = (torch.arange(lmax)[None, :] < lengths[:, None]).to(torch.uint8)
        else:
            out[k] = vals
    return out
