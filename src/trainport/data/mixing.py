"""Weighted mixing of several sources ("dynamic boosting"), made restartable.

:class:`WeightedMixer` draws each next sample from one of its sources, chosen at random with
probability proportional to the source's weight. Training code may change the weights at
any time (:meth:`WeightedMixer.set_weights`), for example to boost a rare class the model
is failing on; the change applies from the very next draw. A weight of 0 pauses a source:
it is not drawn from (and a source never drawn from is never even opened). The draws are a
pure function of the seed, the reader and the weight history, so a run is reproducible.

With DataLoader workers each worker mixes its own shard of every source (sources that are
:class:`~trainport.data.dataset.ChannelDataset` shard themselves) with its own random stream
derived from the seed. The weights live in shared memory, so ``set_weights`` in the training
process reaches the workers too: there a change applies to the next sample each worker
*produces*, and batches the loader has already prefetched keep the old mix.

:meth:`~WeightedMixer.state_dict` holds the random generator's state, the weights, the
draw counts and each source's own ``state_dict()``; restoring it reproduces the identical
next samples.
"""

from __future__ import annotations

import bisect
import logging
import math
import multiprocessing
import random
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from typing import Any

from trainport.data.dataset import _DatasetBase
from trainport.data.errors import DataError
from trainport.data.topology import current_slot

__all__ = ["OnExhausted", "WeightedMixer"]

logger = logging.getLogger(__name__)

_STATE_VERSION = 1


class OnExhausted(StrEnum):
    """What the mixer does when a source runs out of records for the current epoch."""

    RESTART = "restart"  # iterate the source again (its next epoch): an endless stream
    DROP = "drop"  # stop drawing from it; the mix ends when no source with weight is left
    STOP = "stop"  # end the mix


class _SharedWeights:
    """Weights in shared memory plus a version counter, so readers re-read only on change."""

    def __init__(self, values: list[float]) -> None:
        ctx = multiprocessing.get_context()
        self.array = ctx.Array("d", values)
        self.version = ctx.Value("Q", 0, lock=False)

    def set(self, values: list[float]) -> None:
        with self.array.get_lock():
            self.array[:] = values
            self.version.value += 1

    def get(self) -> tuple[int, list[float]]:
        with self.array.get_lock():
            return int(self.version.value), list(self.array[:])


def _is_spawning() -> bool:
    # True while multiprocessing pickles a Process's arguments (DataLoader workers under the
    # spawn/forkserver start methods): the only time shared memory handles can travel.
    from multiprocessing import context

    return getattr(context, "get_spawning_popen", lambda: None)() is not None


class WeightedMixer(_DatasetBase):
    """An endless (by default) weighted mix of named sources.

    ``sources`` maps a name to any iterable (a ChannelDataset, a list, another dataset);
    ``weights`` maps names to non-negative weights (missing names get 1.0). With
    ``with_source=True`` each item is ``(name, sample)``.
    """

    def __init__(
        self,
        sources: Mapping[str, Iterable[Any]],
        weights: Mapping[str, float] | None = None,
        *,
        seed: int = 0,
        on_exhausted: OnExhausted | str = OnExhausted.RESTART,
        with_source: bool = False,
    ) -> None:
        super().__init__()
        if not sources:
            raise DataError("WeightedMixer needs at least one source")
        self.names = list(sources)
        self.sources = dict(sources)
        self.seed = seed
        self.on_exhausted = OnExhausted(on_exhausted)
        self.with_source = with_source
        initial = {name: 1.0 for name in self.names}
        initial.update(self._checked(weights or {}))
        self._shared = _SharedWeights([initial[n] for n in self.names])
        self._version = -1
        self._cumulative: list[float] = []
        self._rng: random.Random | None = None
        self._iters: dict[str, Iterator[Any]] = {}
        self._dropped: set[str] = set()
        self.counts = dict.fromkeys(self.names, 0)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_iters"] = {}  # live iterators (open FIFOs, sockets) do not travel
        if not _is_spawning():
            state["_shared"] = self._shared.get()[1]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_shared"], list):
            state["_shared"] = _SharedWeights(state["_shared"])
        self.__dict__.update(state)

    # -- weights --------------------------------------------------------------------------

    def _checked(self, weights: Mapping[str, float]) -> dict[str, float]:
        checked = {}
        for name, weight in weights.items():
            if name not in self.sources:
                raise DataError(f"no source named {name!r}; sources are {self.names}")
            value = float(weight)
            if not math.isfinite(value) or value < 0:
                raise DataError(f"weight of {name!r} must be finite and >= 0, got {weight!r}")
            checked[name] = value
        return checked

    @property
    def weights(self) -> dict[str, float]:
        return dict(zip(self.names, self._shared.get()[1], strict=True))

    def set_weights(self, weights: Mapping[str, float]) -> None:
        """Change some or all weights; the next sample drawn already uses them."""
        current = self.weights
        current.update(self._checked(weights))
        self._shared.set([current[n] for n in self.names])
        logger.info("mixing weights now %s", current)

    def _refresh(self) -> None:
        version = int(self._shared.version.value)
        if version == self._version:
            return
        self._version, values = self._shared.get()
        total = 0.0
        cumulative = []
        for name, value in zip(self.names, values, strict=True):
            total += 0.0 if name in self._dropped else value
            cumulative.append(total)
        self._cumulative = cumulative

    # -- drawing --------------------------------------------------------------------------

    def _generator(self) -> random.Random:
        if self._rng is None:
            # Each reader (rank, worker) gets its own stream, so workers do not mirror
            # each other's choices.
            self._rng = random.Random(f"trainport.mix:{self.seed}:{current_slot().shard}")
        return self._rng

    def _choose(self, rng: random.Random) -> str | None:
        self._refresh()
        total = self._cumulative[-1]
        if total <= 0:
            return None
        index = bisect.bisect_right(self._cumulative, rng.random() * total)
        if index >= len(self.names):
            # Float rounding landed exactly on the total: take the last source with weight.
            index = len(self.names) - 1
            while index > 0 and self._cumulative[index] == self._cumulative[index - 1]:
                index -= 1
        return self.names[index]

    def _next_from(self, name: str) -> tuple[bool, Any]:
        """(True, sample) from source ``name``, or (False, None) if it has nothing left."""
        iterator = self._iters.get(name)
        # One restart per draw: a source resumed at the end of an epoch comes back empty
        # once; one that is empty again right after a restart has nothing to give.
        restarted = False
        if iterator is None:
            iterator = self._iters[name] = iter(self.sources[name])
        while True:
            try:
                return True, next(iterator)
            except StopIteration:
                self._iters.pop(name, None)
                if self.on_exhausted is not OnExhausted.RESTART or restarted:
                    return False, None
                iterator = self._iters[name] = iter(self.sources[name])
                restarted = True

    def __iter__(self) -> Iterator[Any]:
        rng = self._generator()
        while True:
            name = self._choose(rng)
            if name is None:
                if self.on_exhausted is OnExhausted.DROP and self._dropped:
                    return
                raise DataError(
                    f"every mixing weight is 0 (weights {self.weights}); give a source weight"
                )
            ok, sample = self._next_from(name)
            if not ok:
                if self.on_exhausted is OnExhausted.STOP:
                    return
                # Restart gave nothing, or DROP: never draw from this source again.
                logger.warning("mixing source %r has no more records; dropping it", name)
                self._dropped.add(name)
                self._version = -1
                continue
            self.counts[name] += 1
            yield (name, sample) if self.with_source else sample

    # -- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Generator state, weights, counts and every source's state (JSON-serialisable)."""
        rng = self._generator()
        version, internal, gauss = rng.getstate()
        sources = {}
        for name, source in self.sources.items():
            method = getattr(source, "state_dict", None)
            sources[name] = method() if callable(method) else None
        return {
            "version": _STATE_VERSION,
            "seed": self.seed,
            "rng": [version, list(internal), gauss],
            "weights": self.weights,
            "counts": dict(self.counts),
            "dropped": sorted(self._dropped),
            "sources": sources,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; the next ``iter()`` continues the same mix."""
        if state.get("version") != _STATE_VERSION:
            raise DataError(f"unsupported WeightedMixer state version {state.get('version')!r}")
        if sorted(state["weights"]) != sorted(self.names):
            raise DataError(
                f"checkpoint mixes sources {sorted(state['weights'])}, this mixer {self.names}"
            )
        version, internal, gauss = state["rng"]
        rng = random.Random()
        rng.setstate((version, tuple(internal), gauss))
        self._rng = rng
        self.seed = state["seed"]
        self._shared.set([float(state["weights"][n]) for n in self.names])
        self.counts = {n: int(state["counts"].get(n, 0)) for n in self.names}
        self._dropped = set(state.get("dropped", []))
        self._version = -1
        self._iters = {}
        for name, source_state in state["sources"].items():
            method = getattr(self.sources[name], "load_state_dict", None)
            if source_state is not None and callable(method):
                method(source_state)
