"""TokenDataset windows, labels, position ids, cu_seqlens; RecordDataset; pad_collate."""

import numpy as np
import pytest
import torch
from tm_writer import random_docs, write_dataset

from tokenmill_loader import RecordDataset, TokenDataset, pad_collate


@pytest.fixture
def sft(tmp_path):
    recs = random_docs(80, seed=2, masked=True, max_len=30)
    return write_dataset(tmp_path / "sft", recs, "sft", shard_records=11), recs


def _stream(recs):
    seq = np.concatenate([r["sequence"] for r in recs])
    mask = np.concatenate([r.get("loss_mask", [1] * len(r["sequence"])) for r in recs])
    starts = np.concatenate([[0], np.cumsum([len(r["sequence"]) for r in recs])[:-1]])
    return seq, mask, starts


def test_labels_align_with_inputs(sft):
    """input_ids = stream[b:b+L]; labels = the same tokens where trained, -100 where masked; NOT shifted."""
    path, recs = sft
    seq, mask, _ = _stream(recs)
    ds = TokenDataset(path, 24, stride=7)
    for i in range(len(ds)):
        item = ds[i]
        b = i * 7
        ids, labels = item["input_ids"].numpy(), item["labels"].numpy()
        assert np.array_equal(ids, seq[b : b + 24])
        assert np.array_equal(labels, np.where(mask[b : b + 24] == 1, seq[b : b + 24], -100))
        # under the model's single shift, logits at t predict labels[t+1] = the next stream token
        nxt = labels[1:]
        trained = nxt != -100
        assert np.array_equal(nxt[trained], seq[b + 1 : b + 24][trained])
        assert len(item["position_ids"]) == len(ids) == len(labels) == 24


def test_labels_without_mask_are_tokens(tmp_path):
    recs = random_docs(30, seed=3)
    path = write_dataset(tmp_path / "seq", recs, "seq", shard_records=7)
    seq, _, _ = _stream(recs)
    ds = TokenDataset(path, 10)
    b = ds.get_batch(np.arange(len(ds)))
    assert np.array_equal(b["labels"].numpy(), b["input_ids"].numpy())
    assert np.array_equal(b["input_ids"].numpy().ravel(), seq[: len(ds) * 10])


@pytest.mark.parametrize("seq_len,stride", [(16, 16), (16, 8), (15, 5), (32, 32)])
def test_window_count_and_coverage(sft, seq_len, stride):
    path, recs = sft
    seq, _, _ = _stream(recs)
    total = len(seq)
    ds = TokenDataset(path, seq_len, stride=stride)
    assert len(ds) == (total - seq_len) // stride + 1
    covered = np.zeros(total, dtype=int)
    for i in range(len(ds)):
        b, e = ds.window(i)
        assert e - b == seq_len and b == i * stride
        covered[b:e] += 1
    last_end = (len(ds) - 1) * stride + seq_len
    assert last_end <= total and total - last_end < stride  # only a tail shorter than a stride is unserved
    assert (covered[:last_end] >= 1).all()
    if stride == seq_len:
        assert (covered[:last_end] == 1).all()  # disjoint
    elif stride * 2 == seq_len:
        assert (covered[stride : last_end - stride] == 2).all()  # every inner token in exactly 2 windows
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_position_ids_restart_at_documents(sft):
    path, recs = sft
    seq, _, starts = _stream(recs)
    is_start = np.zeros(len(seq) + 1, dtype=bool)
    is_start[starts] = True
    L = 40
    ds = TokenDataset(path, L, stride=13, cu_seqlens=True)
    idx = np.arange(len(ds))
    batch = ds.get_batch(idx)
    for r, i in enumerate(idx):
        b = i * 13
        ref, p = [], 0
        for j in range(L):
            if j > 0 and is_start[b + j]:
                p = 0
            ref.append(p)
            p += 1
        assert batch["position_ids"][r].tolist() == ref
        one = ds[int(i)]
        assert one["position_ids"].tolist() == ref
        cu = one["cu_seqlens"].tolist()
        assert cu == [0] + [j for j in range(1, L) if is_start[b + j]] + [L]
        assert one["max_seqlen"] == max(np.diff(cu))
    # batch cu_seqlens index the flattened batch: zeros of the flattened position ids, then B*L
    flat = batch["position_ids"].reshape(-1).numpy()
    assert batch["cu_seqlens"].tolist() == np.flatnonzero(flat == 0).tolist() + [flat.size]
    assert batch["cu_seqlens"].dtype == torch.int32


def _reference_batch(seq, mask, doc_starts, idx, seq_len, stride, n_windows):
    """get_batch computed the plain way, window by window and token by token."""
    is_start = set(doc_starts.tolist())
    rows, cu = [], []
    for r, i in enumerate(idx):
        b = (i + n_windows if i < 0 else i) * stride
        ids = seq[b : b + seq_len].astype(np.int64)
        labels = ids.copy() if mask is None else np.where(mask[b : b + seq_len] != 0, ids, -100)
        pos, p = [], 0
        for j in range(seq_len):
            if j == 0 or b + j in is_start:
                p = 0
                cu.append(r * seq_len + j)
            pos.append(p)
            p += 1
        rows.append((ids, labels, pos))
    cu.append(len(idx) * seq_len)
    return rows, cu


@pytest.mark.parametrize("token_dtype, masked", [("uint16", True), ("uint16", False), ("uint32", True)])
def test_get_batch_equals_a_plain_computation(tmp_path, token_dtype, masked):
    """Every output of get_batch, bit for bit: many short documents (empty ones too) over several shards, a
    loss_mask, windows that overlap or leave gaps, repeated and negative indices, batches without any document
    start inside; and windows of 2**16 tokens and more (position ids past the uint16 fast path)."""
    rng = np.random.default_rng(7)
    lengths = rng.choice([0, 1, 2, 3, 5, 9, 40, 300], size=400, p=[0.05, 0.2, 0.15, 0.15, 0.15, 0.1, 0.1, 0.1])
    lengths = np.concatenate([lengths, [70_000, 4, 66_000]])  # long documents for the long windows
    recs = []
    for n in lengths.tolist():
        rec = {"sequence": rng.integers(0, 1000, n).tolist()}
        if masked:
            rec["loss_mask"] = rng.integers(0, 2, n).tolist()
        recs.append(rec)
    path = write_dataset(tmp_path / "d", recs, "sft" if masked else "seq", shard_records=37, token_dtype=token_dtype)
    seq, mask, _ = _stream(recs)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    short = [(1, None), (2, None), (7, 3), (16, None), (33, 5), (64, 100)]
    for seq_len, stride in short + [(65_535, 4_000), (65_536, 3_000), (70_001, 9_000)]:
        ds = TokenDataset(path, seq_len, stride=stride, cu_seqlens=True)
        n = len(ds)
        long = seq_len > 1000  # few windows, each checked token by token below
        batches = [list(range(n))[: 3 if long else 40], [-1, 0, -n, n - 1, 3 % n, 3 % n], [], [n - 1]]
        sizes = rng.integers(1, 4 if long else 12, size=6 if long else 20).tolist()
        batches += [rng.integers(-n, n, size=k).tolist() for k in sizes]
        for idx in batches:
            b = ds.get_batch(idx)
            rows, cu = _reference_batch(seq, mask if masked else None, doc_starts, idx, seq_len, ds.stride, n)
            assert b["input_ids"].shape == b["labels"].shape == b["position_ids"].shape == (len(idx), seq_len)
            assert b["input_ids"].dtype == b["labels"].dtype == b["position_ids"].dtype == torch.int32
            for r, (ids, labels, pos) in enumerate(rows):
                assert np.array_equal(b["input_ids"][r].numpy(), ids), (seq_len, idx, r)
                assert np.array_equal(b["labels"][r].numpy(), labels), (seq_len, idx, r)
                assert b["position_ids"][r].tolist() == pos, (seq_len, idx, r)
            assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].tolist() == cu, (seq_len, idx)
            assert b["max_seqlen"] == (max(np.diff(cu)) if idx else 0)
            # labels are their own memory: writing them leaves input_ids as read
            before = b["input_ids"].clone()
            b["labels"].fill_(-7)
            assert torch.equal(b["input_ids"], before)


def test_get_batch_equals_items_and_dtypes(sft):
    path, _ = sft
    ds = TokenDataset(path, 20, stride=10)
    idx = [5, 0, 17, 3, 3]
    b = ds.__getitems__(idx)
    for r, i in enumerate(idx):
        one = ds[i]
        for k in ("input_ids", "labels", "position_ids"):
            assert torch.equal(b[k][r], one[k])
            assert b[k].dtype == torch.int32  # compact host dtype for uint16 data


@pytest.mark.parametrize("vocab_size, host", [(100000, torch.int32), (2**31, torch.int32), (2**31 + 1, torch.int64)])
def test_uint32_tokens_give_int32_while_the_vocabulary_fits(tmp_path, vocab_size, host):
    """uint32 ids come as int32 when vocab_size <= 2**31 (every id read is checked against it), else int64."""
    recs = [{"sequence": [0, 70000, 70001, 5, 6]}, {"sequence": [0, 99999, 3]}]
    path = write_dataset(tmp_path / "big", recs, "seq", token_dtype="uint32", vocab_size=vocab_size)
    ds = TokenDataset(path, 4, stride=1)
    b = ds.get_batch([0, 1])
    assert b["input_ids"].dtype == b["labels"].dtype == b["position_ids"].dtype == host
    assert b["input_ids"][0].tolist() == [0, 70000, 70001, 5]
    assert b["position_ids"][1].tolist() == [0, 1, 2, 3]
    assert ds[4]["position_ids"].tolist() == [0, 0, 1, 2]
    assert RecordDataset(path)[0]["input_ids"].dtype == host


def test_record_dataset_sft_and_pad_collate(sft):
    path, recs = sft
    rd = RecordDataset(path)
    assert len(rd) == len(recs)
    assert rd.lengths().tolist() == [len(r["sequence"]) for r in recs]
    for j in (0, 10, 11, 79):
        item = rd[j]
        r = recs[j]
        assert item["input_ids"].tolist() == r["sequence"]
        assert item["labels"].tolist() == [t if m else -100 for t, m in zip(r["sequence"], r["loss_mask"])]
        assert item["position_ids"].tolist() == list(range(len(r["sequence"])))
    b = pad_collate([rd[0], rd[1], rd[2]], pad_id=2)
    n = [len(recs[i]["sequence"]) for i in range(3)]
    assert b["input_ids"].shape == (3, max(n))
    assert b["attention_mask"].sum(1).tolist() == n
    for i in range(3):
        assert (b["input_ids"][i, n[i] :] == 2).all() and (b["labels"][i, n[i] :] == -100).all()


@pytest.mark.parametrize("workers", [0, 2])
def test_readme_loop_on_cpu_cross_entropy_straight_from_the_dataloader(sft, workers):
    """F.cross_entropy takes int64 targets only: the loaders' labels are int64 (ids stay compact), for token
    windows, padded records, packed and mixed batches; DevicePrefetcher asks for compact host labels and upcasts
    them itself."""
    import torch.nn.functional as F

    from tokenmill_loader import DataLoader, DevicePrefetcher, MixedLoader, PackingLoader

    path, _ = sft
    vocab = 1000

    def loaders():
        windows = DataLoader(TokenDataset(path, 16), batch_size=4, seed=0, num_workers=workers)
        packed = PackingLoader(RecordDataset(path), max_tokens=64, num_workers=workers)
        return {
            "windows": windows,
            "padded": DataLoader(RecordDataset(path), batch_size=4, num_workers=workers),
            "packed": packed,
            "mixed": MixedLoader({"w": windows, "p": packed}, {"w": 1, "p": 1}, on_exhausted="stop"),
        }

    for name, loader in loaders().items():
        for batch in loader:
            logits = torch.zeros(*batch["input_ids"].shape, vocab)
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())  # shift once
            assert torch.isfinite(loss), name
            assert batch["labels"].dtype == torch.int64 and batch["input_ids"].dtype == torch.int32, name
    for name, loader in loaders().items():
        prefetched = iter(DevicePrefetcher(loader, "cpu"))
        assert next(prefetched)["labels"].dtype == torch.int64
        assert loader.compact_labels, name  # what crosses to the device: int32
        prefetched.close()
        assert not loader.compact_labels and next(iter(loader))["labels"].dtype == torch.int64, name


def test_batch_memory_is_reused_only_once_every_view_is_gone(tmp_path):
    """In the reading process a batch's buffer is used again after the caller dropped the batch, never while a
    tensor or numpy view of it lives; batches are the same either way."""
    path = write_dataset(tmp_path / "d", random_docs(200, seed=5), "seq")
    ds = TokenDataset(path, 16)
    fresh = TokenDataset(path, 16)
    first = ds.get_batch([0, 1, 2])
    where, kept_ids, kept_numpy = first["input_ids"].data_ptr(), first["input_ids"].clone(), first["labels"].numpy()
    kept_labels = kept_numpy.copy()
    del first
    for i in range(10):  # the labels' numpy view keeps the buffer: never written again
        assert ds.get_batch([i, i + 1, i + 2])["input_ids"].data_ptr() != where
    assert np.array_equal(kept_numpy, kept_labels)
    del kept_numpy
    again = ds.get_batch([5, 6, 7])
    assert again["input_ids"].data_ptr() == where  # dropped: its memory serves the next batch
    for k, v in fresh.get_batch([5, 6, 7]).items():
        assert torch.equal(again[k], v), k
    assert torch.equal(ds.get_batch([0, 1, 2])["input_ids"], kept_ids)


def test_batches_read_from_threads_never_share_memory(tmp_path):
    import concurrent.futures

    path = write_dataset(tmp_path / "d", random_docs(200, seed=6), "seq")
    ds, reference = TokenDataset(path, 16), TokenDataset(path, 16)
    indices = [[i, i + 3, i + 7] for i in range(60)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(ds.get_batch, indices))  # all kept: 60 batches in 60 buffers
    assert len({b["input_ids"].data_ptr() for b in batches}) == len(batches)
    for b, idx in zip(batches, indices):
        assert torch.equal(b["input_ids"], reference.get_batch(idx)["input_ids"])
