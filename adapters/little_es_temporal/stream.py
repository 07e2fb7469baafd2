"""How the Temporal adapter reads and writes a run's stream: :class:`TemporalRunWriter`.

Parallel branches may run on several workers at once and all append to the
run's stream. Each write catches up with the stored stream, lets the step
executor decide and commit, and on a lost optimistic-concurrency race does it
again; the ``Run`` aggregates a worker has loaded are kept in a
:class:`RunCache`, so catching up reads only the events appended since.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar
from uuid import UUID

from little_es.domain import Run
from little_es.durability import NOTHING_READ, RunRecorder
from little_es.engine.executor import RunWriter, outputs_from_fold
from little_es.errors import ConcurrencyConflictError
from little_es.materialize import RunFold
from little_es.world import World
from little_es_temporal.errors import TemporalAdapterError

__all__ = ["RunCache", "TemporalRunWriter"]

T = TypeVar("T")

# Lost races resolve (each round one writer wins); a step's result must not be
# lost to them, so give up only after many.
_CONFLICT_RETRIES = 100


class RunCache:
    """The ``Run`` aggregates a worker has loaded, brought up to date by reading only new events.

    Loading a run folds its stream from the latest snapshot (up to
    ``RUN_SNAPSHOT_INTERVAL`` events); a step activity needs the run's state
    two or three times. Instead, each use reads the events appended since the
    cached version (usually none: one indexed query) and folds just those, so
    the state is always the stored one, whoever wrote it. An aggregate whose
    save failed is dropped: its state may hold the event that was not saved.
    """

    def __init__(self, world: World, capacity: int = 256) -> None:
        self._world = world
        self._capacity = capacity
        self._runs: OrderedDict[str, Run] = OrderedDict()

    def recorder(self, run_id: str) -> RunRecorder | None:
        """A recorder over the current state of ``run_id``, or None when it has no log."""
        run = self._runs.get(run_id)
        if run is None:
            loaded = RunRecorder.load(self._world, run_id)
            if loaded is None:
                return None
            run = loaded.run
        else:
            self._world.catch_up(run)
        self._keep(run_id, run)
        return RunRecorder(self._world, run)

    def cached(self, run_id: str) -> RunRecorder | None:
        """A recorder over the cached state of ``run_id`` as it is (None when not cached)."""
        run = self._runs.get(run_id)
        return None if run is None else RunRecorder(self._world, run)

    def keep(self, recorder: RunRecorder) -> None:
        """Cache the aggregate of a recorder that just committed (a run just started)."""
        self._keep(recorder.run_id, recorder.run)

    def _keep(self, run_id: str, run: Run) -> None:
        self._runs[run_id] = run
        self._runs.move_to_end(run_id)
        while len(self._runs) > self._capacity:
            self._runs.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop ``run_id``: the next use loads it afresh."""
        self._runs.pop(run_id, None)


class TemporalRunWriter(RunWriter):
    """The executor's seam on Temporal: the run's stream as stored, whoever wrote it.

    :meth:`read` catches the cached aggregate up with the stored stream;
    :meth:`write` runs an action on it and, when another writer (a parallel
    branch on another worker, another process) appended first and nothing was
    written, catches up, decides again and commits again.
    """

    def __init__(self, cache: RunCache, world: World, run_id: str) -> None:
        super().__init__(world, run_id)
        self._cache = cache
        self._parents: dict[str, RunRecorder] = {}
        """The parents' states this writer read, its own (not the cache's, which another
        activity's action may hold): each later check is one indexed query."""

    def read(self) -> RunFold:
        return self._recorder().fold

    def refresh(self, unchanged: Mapping[UUID, int] = NOTHING_READ) -> RunFold:
        # Before each step and call: the cached state plus what others appended since.
        recorder = self._cache.cached(self.run_id)
        if recorder is None:
            return self.read()
        recorder.refresh(unchanged)
        return recorder.fold

    def watched(self) -> tuple[UUID, int] | None:
        recorder = self._cache.cached(self.run_id)
        return None if recorder is None else recorder.watched()

    def parents(self) -> Iterator[tuple[str, RunFold]]:
        # A child workflow's parents are other workflows: their logs say whether one
        # was cancelled (a parent's id never changes once its child started).
        # Never self.read(): it would catch up the aggregate an action of this writer
        # may hold, folding in a RunCancelled its next append would then not lose to.
        own = self._cache.cached(self.run_id)
        parent_id = (own if own is not None else self._recorder()).fold.parent_run_id
        seen = {self.run_id}
        while parent_id is not None and parent_id not in seen:
            seen.add(parent_id)
            recorder = self._parents.get(parent_id)
            if recorder is None:
                recorder = RunRecorder.load(self.world, parent_id)
                if recorder is None:
                    return
                self._parents[parent_id] = recorder
            else:
                recorder.refresh()
            yield parent_id, recorder.fold
            parent_id = recorder.fold.parent_run_id

    def _recorder(self) -> RunRecorder:
        recorder = self._cache.recorder(self.run_id)
        if recorder is None:
            raise TemporalAdapterError(
                f"run {self.run_id!r} has no log in world {self.world.name}: the worker's world"
                " must be the one the run was started in (--world / LITTLE_ES_WORLD)"
            )
        return recorder

    async def write(self, action: Callable[[RunRecorder], T], *, catch_up: bool = True) -> T:
        for attempt in range(_CONFLICT_RETRIES):
            recorder = None if catch_up or attempt else self._cache.cached(self.run_id)
            if recorder is None:
                recorder = self._recorder()
            try:
                return action(recorder)
            except ConcurrencyConflictError:
                self._cache.forget(self.run_id)
                if attempt + 1 == _CONFLICT_RETRIES:
                    raise
                await asyncio.sleep(random.uniform(0, 0.005 * 2 ** min(attempt, 6)))
            except BaseException:
                # Its state may hold the event that was not saved.
                self._cache.forget(self.run_id)
                raise
        raise AssertionError("unreachable")

    def outputs(self, fold: RunFold) -> dict[str, Any]:
        return outputs_from_fold(self.world, fold)
