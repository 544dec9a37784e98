"""DevicePrefetcher: overlap host-to-device copies of the next batch with compute on the current one."""

from __future__ import annotations

import torch

# compact host dtypes that become int64 on the device (token ids, labels, positions, boundaries)
_UPCAST = tuple(getattr(torch, n) for n in ("int32", "int16", "uint16", "uint32") if hasattr(torch, n))


def _map(obj, fn):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_map(v, fn) for v in obj)
    return obj


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


class DevicePrefetcher:
    """Iterate `loader` with each batch already on `device`.

    On CUDA: while the caller works on batch k, batch k+1 is pinned (if the loader did not pin it),
    copied with non_blocking=True on a side stream and upcast there (int32/int16/uint16/uint32 ->
    int64; `cu_seqlens` stays int32 as varlen kernels want). Before a batch is handed out the current
    stream waits for the side stream (wait_stream), and every tensor of the batch is marked with
    record_stream(current stream) so the caching allocator never reuses its memory while compute may
    still read it. On a CPU device the batches pass through (upcast too when `upcast=True`).
    With `upcast=True` a loader that can (`set_compact_labels`: DataLoader, PackingLoader, MixedLoader) gives
    compact host labels while this iterates, so they cross to the device at half size and become int64 there;
    iterated on its own the loader gives int64 labels again.
    State calls (state_dict/load_state_dict/set_epoch) go to the wrapped loader; note the wrapped
    loader counts the one batch held in advance as consumed, so save state from the loader *before*
    prefetching further, or use `state_dict()` here, which reports the loader's state as of the batch
    last handed out.
    """

    def __init__(self, loader, device=None, upcast: bool = True, keep_int32=("cu_seqlens",)):
        self.loader = loader
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.upcast = upcast
        self.keep_int32 = set(keep_int32)
        self._state_for_current = None

    def __len__(self):
        return len(self.loader)

    def _convert(self, batch):
        if not self.upcast:
            return batch

        def up(t):
            return t.long() if t.dtype in _UPCAST else t

        if isinstance(batch, dict):
            return {k: (v if k in self.keep_int32 else _map(v, up)) for k, v in batch.items()}
        return _map(batch, up)

    def _move(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type == "cpu" and not t.is_pinned():
            t = t.pin_memory()  # an async copy needs page-locked memory
        return t.to(self.device, non_blocking=True)

    def _snapshot(self):
        sd = getattr(self.loader, "state_dict", None)
        return sd() if sd is not None else None

    def __iter__(self):
        switch = self.upcast and getattr(self.loader, "compact_labels", True) is False
        if switch:
            self.loader.set_compact_labels(True)
        try:
            yield from self._batches()
        finally:
            if switch:
                self.loader.set_compact_labels(False)

    def _batches(self):
        if self.device.type != "cuda":
            for batch in self.loader:
                self._state_for_current = self._snapshot()
                yield self._convert(batch)
            return
        stream = torch.cuda.Stream(device=self.device)
        it = iter(self.loader)

        def preload():
            try:
                host = next(it)
            except StopIteration:
                return None, None
            state = self._snapshot()
            with torch.cuda.stream(stream):
                dev = self._convert(_map(host, self._move))
            return dev, state

        nxt, nstate = preload()
        while nxt is not None:
            cur_stream = torch.cuda.current_stream(self.device)
            cur_stream.wait_stream(stream)
            batch, self._state_for_current = nxt, nstate
            for t in _tensors(batch):
                t.record_stream(cur_stream)
            nxt, nstate = preload()
            yield batch

    def state_dict(self):
        """The wrapped loader's state as of the last batch handed out (not the one prefetched)."""
        if self._state_for_current is not None:
            return self._state_for_current
        return self.loader.state_dict()

    def load_state_dict(self, state):
        self._state_for_current = None
        self.loader.load_state_dict(state)

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)
