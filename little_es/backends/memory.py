"""The memory backend: eventsourcing's POPO recorders, blobs, leases and read model in a dict.

Everything lives in this process's memory and is gone when the backend is
closed or the process exits. For tests.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import ApplicationRecorder, StoredEvent, Tracking
from eventsourcing.popo import (
    POPOAggregateRecorder,
    POPOApplicationRecorder,
    POPOFactory,
    POPOTrackingRecorder,
)
from eventsourcing.utils import get_topic

from little_es.backends.base import (
    ApplicationClass,
    ArtifactStore,
    Backend,
    RunLeases,
    RunSummary,
    RunsView,
    SnapshotRows,
    StreamWatch,
    dump_state,
    load_state,
    oldest_first,
)
from little_es.chain import Head
from little_es.materialize import MaterializedRunState


class MemoryBackend(Backend):
    """A world in this process's memory (``memory://``)."""

    def __init__(self, app_class: ApplicationClass) -> None:
        super().__init__(
            app=app_class(env={"PERSISTENCE_MODULE": get_topic(LittlePOPOFactory)}),
            artifacts=MemoryArtifactStore(),
            leases=MemoryRunLeases(),
            name="memory://",
        )
        self._view: MemoryRunsView | None = None
        self._view_lock = threading.Lock()

    def stream_head(self, stream_id: UUID) -> Head | None:
        """See :meth:`Backend.stream_head`."""
        recorder = self.app.recorder
        assert isinstance(recorder, LittlePOPOApplicationRecorder)
        return recorder.heads.get(stream_id)

    def stream_heads(self) -> dict[UUID, Head]:
        """See :meth:`Backend.stream_heads`."""
        recorder = self.app.recorder
        assert isinstance(recorder, LittlePOPOApplicationRecorder)
        return dict(recorder.heads)

    def runs_view(self) -> MemoryRunsView:
        """The one view of this world: a later projection continues from an earlier one."""
        with self._view_lock:
            if self._view is None:
                self._view = MemoryRunsView()
            return self._view


class LittlePOPOApplicationRecorder(POPOApplicationRecorder):
    """eventsourcing's in-memory recorder, keeping stream heads with the rows."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: dict[UUID, Head] = {}

    def _insert_events(
        self,
        stored_events: Sequence[StoredEvent],
        *,
        heads: Mapping[UUID, Head] | None = None,
        watch: StreamWatch | None = None,
        snapshots: SnapshotRows | None = None,
        **kwargs: Any,
    ) -> Sequence[int] | None:
        store, rows = snapshots if snapshots is not None else (None, ())
        assert store is None or isinstance(store, POPOAggregateRecorder)
        with (
            self._database_lock,
            contextlib.nullcontext() if store is None else store._database_lock,
        ):
            if store is not None:
                # Refused before the rows go in: the rows and the snapshots, or neither.
                store._assert_uniqueness(rows)
            ids = super()._insert_events(stored_events, **kwargs)
            if store is not None:
                store._update_table(rows)
            self.heads.update(heads or {})
            if watch is not None:
                watch.found(
                    sid
                    for sid, version in watch.versions.items()
                    if self.select_events(sid, gt=version, limit=1)
                )
            return ids


class LittlePOPOFactory(POPOFactory):
    """eventsourcing's in-memory factory with :class:`LittlePOPOApplicationRecorder`."""

    def application_recorder(self) -> ApplicationRecorder:
        """The recorder that keeps heads."""
        return LittlePOPOApplicationRecorder()


class MemoryArtifactStore(ArtifactStore):
    """Blobs in a dict."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def _write_blob(self, sha256: str, data: bytes) -> None:
        with self._lock:
            self._blobs.setdefault(sha256, data)

    def _read_blob(self, sha256: str) -> bytes | None:
        return self._blobs.get(sha256)


class MemoryRunLeases(RunLeases):
    """Leases within one process; each grant is a new token, so a broken one stays lost."""

    def __init__(self) -> None:
        self._held: dict[UUID, object] = {}
        self._lock = threading.Lock()

    def _acquire(self, key: UUID) -> tuple[UUID, object] | None:
        with self._lock:
            if key in self._held:
                return None
            grant = self._held[key] = object()
            return key, grant

    def _release(self, token: tuple[UUID, object]) -> None:
        key, grant = token
        with self._lock:
            if self._held.get(key) is grant:
                del self._held[key]

    def _lost(self, token: tuple[UUID, object]) -> str | None:
        key, grant = token
        return None if self._held.get(key) is grant else "it was broken"

    def _holder(self, key: UUID) -> str | None:
        return "this process" if key in self._held else None

    def _break(self, key: UUID) -> str | None:
        with self._lock:
            return "this process" if self._held.pop(key, None) is not None else None


class MemoryRunsView(POPOTrackingRecorder, RunsView):
    """The runs read model in memory."""

    def __init__(self) -> None:
        super().__init__()
        self._states: dict[str, bytes] = {}
        self._summaries: dict[str, RunSummary] = {}
        self._streams: dict[UUID, str] = {}

    def runs_of_streams(self, stream_ids: Iterable[UUID]) -> dict[UUID, str]:
        """See :meth:`RunsView.runs_of_streams`."""
        with self._database_lock:
            return {s: self._streams[s] for s in stream_ids if s in self._streams}

    def load_state(self, run_id: str) -> MaterializedRunState | None:
        """See :meth:`RunsView.load_state`."""
        with self._database_lock:
            data = self._states.get(run_id)
        # Stored serialised, like the other backends, so a caller can never alias it.
        return None if data is None else load_state(data)

    def commit(
        self,
        states: Mapping[str, MaterializedRunState],
        streams: Mapping[UUID, str],
        tracking: Tracking,
    ) -> None:
        """See :meth:`RunsView.commit`."""
        dumped = {run_id: dump_state(state) for run_id, state in states.items()}
        with self._database_lock:
            self._assert_tracking_uniqueness(tracking)
            self._states.update(dumped)
            self._summaries.update({r: RunSummary.of(r, s) for r, s in states.items()})
            self._streams.update(streams)
            self._insert_tracking(tracking)

    def summaries(self) -> tuple[RunSummary, ...]:
        """See :meth:`RunsView.summaries`."""
        with self._database_lock:
            return oldest_first(self._summaries.values())
