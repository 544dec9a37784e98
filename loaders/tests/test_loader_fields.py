"""TokenDataset(fields=...): the planes asked for are those of the full batch, in process, pickled, through
DataLoader workers (BatchRing slots sized for them), across a resume and through DevicePrefetcher."""

import pickle

import numpy as np
import pytest
import torch
from tm_writer import write_dataset

from tokenmill_loader import DataLoader, DevicePrefetcher, TokenDataset

FULL = ("input_ids", "labels", "position_ids")
SUBSETS = [("input_ids",), ("input_ids", "position_ids"), ("input_ids", "labels")]


@pytest.fixture(scope="module", params=[("uint16", True), ("uint32", False)], ids=["uint16-masked", "uint32"])
def path(request, tmp_path_factory):
    """Short and empty documents over several shards; a loss_mask on the uint16 split."""
    token_dtype, masked = request.param
    rng = np.random.default_rng(11)
    recs = []
    for n in rng.choice([0, 1, 3, 9, 40, 200], size=300).tolist():
        rec = {"sequence": rng.integers(0, 1000, n).tolist()}
        if masked:
            rec["loss_mask"] = rng.integers(0, 2, n).tolist()
        recs.append(rec)
    tmp = tmp_path_factory.mktemp("fields")
    return write_dataset(tmp / "d", recs, "sft" if masked else "seq", shard_records=23, token_dtype=token_dtype)


def assert_planes_of(got: dict, full: dict, fields) -> None:
    """`got` holds exactly `fields` (in FULL order) plus what full has beyond the planes, each equal to full's."""
    extra = [k for k in full if k not in FULL]
    assert list(got) == [k for k in FULL if k in fields] + extra
    for k, v in got.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == full[k].dtype and torch.equal(v, full[k]), k
        else:
            assert v == full[k], k


@pytest.mark.parametrize("fields", SUBSETS + [FULL, ("position_ids", "input_ids")])
@pytest.mark.parametrize("cu_seqlens", [False, True])
def test_fields_are_the_full_batches_planes(path, fields, cu_seqlens):
    seq_len, stride = 33, 20
    full = TokenDataset(path, seq_len, stride=stride, cu_seqlens=cu_seqlens)
    ds = TokenDataset(path, seq_len, stride=stride, cu_seqlens=cu_seqlens, fields=fields)
    n = len(ds)
    assert ds.batch_nbytes(8) == len(set(fields)) * 8 * seq_len * ds.out_dtype.itemsize
    rng = np.random.default_rng(0)
    batches = [list(range(n)), [-1, 0, n - 1, 5, 5], [], [3]] + [rng.integers(-n, n, k).tolist() for k in (1, 7, 32)]
    for idx in batches:
        assert_planes_of(ds.get_batch(idx), full.get_batch(idx), fields)
    assert_planes_of(ds[4], full[4], fields)
    again = pickle.loads(pickle.dumps(ds))  # as a spawned worker receives it
    assert again.fields == ds.fields
    assert_planes_of(again.get_batch(batches[1]), full.get_batch(batches[1]), fields)


def test_input_ids_only_through_workers_and_a_resume(path):
    """Two workers read input_ids-only batches into ring slots of one plane; every batch, before and after a
    resume in a new loader, equals the in-process full batch's input_ids."""
    full = TokenDataset(path, 17, cu_seqlens=True)
    ds = TokenDataset(path, 17, cu_seqlens=True, fields=("input_ids",))
    want = list(DataLoader(full, batch_size=4, seed=3, compact_labels=True))
    dl = DataLoader(ds, batch_size=4, seed=3, num_workers=2)
    assert dl._ring_slot_bytes == 4 * 17 * ds.out_dtype.itemsize
    got = 0
    for batch in dl:  # each batch dropped before the next: every one comes through a slot
        assert_planes_of(batch, want[got], ("input_ids",))
        got += 1
        if got == 5:
            break
    resumed = DataLoader(ds, batch_size=4, seed=3, num_workers=2)
    resumed.load_state_dict(dl.state_dict())
    for batch in resumed:
        assert_planes_of(batch, want[got], ("input_ids",))
        got += 1
    assert got == len(want) > 10
    assert dl.shared_memory_batches == 5 and resumed.shared_memory_batches == len(want) - 5


def test_input_ids_only_through_the_device_prefetcher(path):
    ds = TokenDataset(path, 16, fields=("input_ids",))
    want = list(DataLoader(TokenDataset(path, 16), batch_size=4, seed=1))
    got = list(DevicePrefetcher(DataLoader(ds, batch_size=4, seed=1), "cpu"))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert list(a) == ["input_ids"] and a["input_ids"].dtype == torch.int64
        assert torch.equal(a["input_ids"], b["input_ids"].long())


@pytest.mark.parametrize(
    "fields, problem",
    [
        (("input_ids", "tokens"), "unknown 'tokens'"),
        (("labels",), "input_ids missing"),
        ((), "input_ids missing"),
        (("input_ids", "input_ids"), "given twice"),
    ],
)
def test_fields_outside_the_planes_are_refused(path, fields, problem):
    with pytest.raises(ValueError, match=problem) as e:
        TokenDataset(path, 16, fields=fields)
    assert "input_ids plus any of labels, position_ids" in str(e.value)


def test_one_field_may_be_named_alone(path):
    assert TokenDataset(path, 16, fields="input_ids").fields == ("input_ids",)


@pytest.mark.parametrize("as_array", [False, True])
def test_window_indices_outside_are_refused_as_lists_and_arrays(path, as_array):
    """get_batch checks a list of ints with Python's min and max, anything else with numpy's: the same bounds."""
    ds = TokenDataset(path, 16, fields=("input_ids",))
    n = len(ds)
    for bad in ([0, n], [-n - 1, 3], [n + 5]):
        with pytest.raises(IndexError, match="out of range"):
            ds.get_batch(np.array(bad) if as_array else bad)
    idx = [-n, n - 1, -1]
    assert torch.equal(
        ds.get_batch(np.array(idx) if as_array else idx)["input_ids"], ds.get_batch([0, n - 1, n - 1])["input_ids"]
    )
