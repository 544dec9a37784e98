"""MixedLoader: several loaders mixed by integer ratios, one source per batch, resumable."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class MixedLoader:
    """Mix batches of several resumable loaders by integer ratios.

    - One batch comes from one source (a dict batch gets a "source" key with the source's name).
    - Selection is earliest-deadline-first over Pfair windows: with p_i = ratio_i / sum(ratios), the
      j-th batch of source i may be taken at step t (0-based) once t >= floor((j-1) / p_i) and is due
      by ceil(j / p_i); each step takes the eligible source with the earliest due step (ties by a
      priority order drawn from `seed`). Uniprocessor EDF meets every such window, so after any n
      batches source i has been chosen floor(n p_i) or ceil(n p_i) times: strictly within +-1 of
      n * p_i. (Smooth weighted round-robin, tried first, drifts to 1.02 on some ratio sets.)
      Deterministic: step k always picks the same source.
    - Sources with ratio <= 0 are skipped entirely.
    - An exhausted source (end of its epoch): on_exhausted="restart" (default) starts its next epoch
      (its own loader advances the epoch), so iteration is endless; "stop" ends the iteration.
    - state_dict(): the step counter, the per-source counts and each inner loader's state_dict (which count what
      was yielded). load_state_dict() before iterating resumes at the exact next batch.

    `loaders`: a dict name -> loader or a list (names "0", "1", ...); `ratios` likewise (dict or list).
    """

    def __init__(self, loaders, ratios, seed: int = 0, on_exhausted: str = "restart"):
        if isinstance(loaders, dict):
            names = list(loaders)
            lds = [loaders[n] for n in names]
            rs = [ratios[n] for n in names] if isinstance(ratios, dict) else list(ratios)
        else:
            lds = list(loaders)
            names = [str(i) for i in range(len(lds))]
            rs = list(ratios)
        if len(rs) != len(lds):
            raise ValueError("one ratio per loader")
        if any(int(r) != r for r in rs):
            raise ValueError("ratios must be integers")
        if on_exhausted not in ("restart", "stop"):
            raise ValueError("on_exhausted must be 'restart' or 'stop'")
        self.names = [n for n, r in zip(names, rs) if r > 0]
        self.loaders = [ld for ld, r in zip(lds, rs) if r > 0]
        self.ratios = np.array([int(r) for r in rs if r > 0], dtype=np.int64)
        if not len(self.loaders):
            raise ValueError("no source with a positive ratio")
        self.total = int(self.ratios.sum())
        self.seed = int(seed)
        self.on_exhausted = on_exhausted
        # tie-break priority (lower wins), fixed by the seed
        rng = np.random.default_rng(np.random.SeedSequence((self.seed, 0x5EED)))
        self._priority = rng.permutation(len(self.loaders))
        self.step = 0
        self.counts = np.zeros(len(self.loaders), dtype=np.int64)

    def _pick(self, step: int, counts: np.ndarray) -> int:
        j = counts + 1  # the next batch of each source
        release = ((j - 1) * self.total) // self.ratios
        due = -((-j * self.total) // self.ratios)
        eligible = release <= step
        if not eligible.any():  # cannot happen with Pfair windows; keep going regardless
            eligible[:] = True
        cands = np.flatnonzero(eligible)
        d = due[cands]
        cands = cands[d == d.min()]
        return int(cands[np.argmin(self._priority[cands])])

    def schedule(self, n: int) -> list[int]:
        """Sources of the first n steps, without reading data."""
        counts = np.zeros_like(self.counts)
        out = []
        for t in range(n):
            i = self._pick(t, counts)
            counts[i] += 1
            out.append(i)
        return out

    def __iter__(self):
        its: dict[int, Iterator] = {}
        try:
            while True:
                i = self._pick(self.step, self.counts)
                if i not in its:
                    its[i] = iter(self.loaders[i])
                try:
                    batch = next(its[i])
                except StopIteration:
                    if self.on_exhausted == "stop":
                        return
                    its[i] = iter(self.loaders[i])
                    try:
                        batch = next(its[i])
                    except StopIteration:
                        raise RuntimeError(f"source {self.names[i]!r} yields no batch at all") from None
                self.counts[i] += 1
                self.step += 1
                if isinstance(batch, dict):
                    batch = {**batch, "source": self.names[i]}
                yield batch
        finally:
            for it in its.values():
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def state_dict(self) -> dict:
        return {
            "step": self.step,
            "counts": self.counts.tolist(),
            "seed": self.seed,
            "names": list(self.names),
            "inner": {n: ld.state_dict() for n, ld in zip(self.names, self.loaders)},
        }

    @property
    def compact_labels(self) -> bool:
        return all(getattr(ld, "compact_labels", True) for ld in self.loaders)

    def set_compact_labels(self, compact: bool) -> None:
        """Passed on to the sources that have it (DevicePrefetcher asks for compact host labels)."""
        for ld in self.loaders:
            if hasattr(ld, "set_compact_labels"):
                ld.set_compact_labels(compact)

    def load_state_dict(self, state: dict) -> None:
        if list(state["names"]) != self.names:
            raise ValueError(f"mixed state is for sources {state['names']}, this loader has {self.names}")
        self.step = int(state["step"])
        self.counts = np.array(state["counts"], dtype=np.int64)
        for n, ld in zip(self.names, self.loaders):
            ld.load_state_dict(state["inner"][n])
