"""The worker threads that run sync step functions and sync tools off the event loop.

Like ``asyncio.to_thread``: the call runs in a copy of the caller's context (so a
held lease is still checked inside it) and hands back its result or exception.
Unlike it, a worker does its bookkeeping before it wakes the loop and waits for
the next call right after, so the woken loop does not find the GIL still held
(``asyncio.to_thread``'s worker frees its work item and releases a pure-Python
semaphore after it): a sync step costs a few percent less (the README's
measurements). And a worker keeps nothing of a call once it returned, which the
local engine's in-place outputs need (``engine/local.py``'s ``set_output``).

At most ``min(32, cpus + 4)`` calls of one event loop run at once (asyncio's
default executor's limit, which is per loop too); more wait their turn.
:func:`set_max_worker_threads` changes the limit, for every loop. A worker idle
for :data:`_IDLE_SECONDS` ends, and the workers of a loop that is closed (found by
the next loop's first call) or gone end once they have no call to run.
Workers are daemon threads: a process that exits while a call runs does not
wait for it, which for a step is a crash (the step is in flight and runs again
on resume), not a hang at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")

_IDLE_SECONDS = 30.0
DEFAULT_MAX_WORKER_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""asyncio's default executor's limit: ``min(32, CPUs + 4)``."""
_max_workers = DEFAULT_MAX_WORKER_THREADS
_numbers = itertools.count(1)

_Job = tuple[
    asyncio.AbstractEventLoop,
    "asyncio.Future[Any]",
    contextvars.Context,
    Callable[..., Any],
    tuple[Any, ...],
    dict[str, Any],
]


class _Pool:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.lock = threading.Lock()
        # The queue holds one job for each worker promised one, and `backlog` more,
        # which the next workers to finish take; `idle` workers wait promised none.
        # A call promises an idle worker its job, or starts one while fewer than
        # _max_workers live, or joins the backlog. So no job waits in the queue
        # without a worker on its way, and no worker ends with one still coming.
        # Under a lowered limit, a worker beyond it ends once its call is done and
        # leaves the backlog to the others (it ends only while more than the limit
        # live, so some always remain), and a None in the queue is a job that ends
        # an idle one: idle workers never outnumber the limit, nor wait beside a
        # backlog.
        self.idle = 0
        self.backlog = 0
        self.workers = 0
        # Its loop is closed or gone: no call can come, so no worker waits idle.
        self.closed = False


# One pool per event loop, as asyncio's default executor is: a sync step that runs a
# workflow of its own in a new loop (asyncio.run in its worker thread) gets workers of
# that loop's, and cannot wait forever for one its own loop's steps all hold.
_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Pool] = weakref.WeakKeyDictionary()
_shared = _Pool()  # for a loop that cannot be weakly referenced
_pools_lock = threading.Lock()


def _pool_of(loop: asyncio.AbstractEventLoop) -> _Pool:
    try:
        pool = _pools.get(loop)
    except TypeError:
        return _shared
    if pool is not None:
        return pool
    closed: list[_Pool] = []
    with _pools_lock:
        pool = _pools.get(loop)
        if pool is None:
            # A program that calls asyncio.run again and again makes a loop, and a pool,
            # each time: the idle workers of those it closed would each wait out the idle
            # timeout for calls that cannot come (thousands of threads in a tight loop).
            for other, old in list(_pools.items()):
                if other.is_closed():
                    del _pools[other]
                    closed.append(old)
            pool = _pools[loop] = _Pool()
            weakref.finalize(loop, _close, pool).atexit = False
    for old in closed:
        _close(old)
    return pool


def _close(pool: _Pool) -> None:
    """End ``pool``'s idle workers, and each busy one once its call is done."""
    with pool.lock:
        if pool.closed:
            return
        pool.closed = True
        ending, pool.idle = pool.idle, 0
        pool.workers -= ending
    for _ in range(ending):
        pool.jobs.put(None)


def _reset_after_fork() -> None:
    # A forked child has none of its parent's threads: counted as idle, they would
    # leave every call waiting for a worker that is not there.
    global _pools, _shared, _pools_lock
    _pools = weakref.WeakKeyDictionary()
    _shared = _Pool()
    _pools_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def run_in_worker(fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> asyncio.Future[_T]:
    """Call ``fn(*args, **kwargs)`` in a worker thread, in a copy of the caller's
    context; await the returned future for its result (or its exception)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[_T] = loop.create_future()
    pool = _pool_of(loop)
    with pool.lock:
        start = False
        if pool.idle:
            pool.idle -= 1
        elif pool.workers < _max_workers:
            start = True
            pool.workers += 1
        else:
            pool.backlog += 1
    if start:
        try:
            _start(pool)
        except BaseException:
            with pool.lock:
                pool.workers -= 1
            raise
    pool.jobs.put((loop, future, contextvars.copy_context(), fn, args, kwargs))
    return future


def max_worker_threads() -> int:
    """How many sync step functions and sync tools of one event loop run at once, at
    most (see :func:`set_max_worker_threads`)."""
    return _max_workers


def set_max_worker_threads(limit: int) -> int:
    """Let at most ``limit`` sync step functions and sync tools of one event loop run at
    once (each in a worker thread of its own); return the limit before.

    The default is asyncio's default executor's, ``min(32, CPUs + 4)``. Raise it for
    sync steps and tools that mostly wait (a blocking HTTP client, a subprocess) in
    wide parallel groups or agent turns: calls over the limit wait their turn, as
    they would for ``asyncio.to_thread``. The limit is this process's and holds for
    every event loop, the local engine's and a Temporal worker's alike. Raised, calls
    already waiting start at once; lowered, no call starts while ``limit`` or more
    run, and the workers beyond it end as they finish.
    """
    global _max_workers
    if not isinstance(limit, int) or isinstance(limit, bool):
        raise TypeError(
            f"the worker thread limit must be an int, got {type(limit).__name__} {limit!r}"
        )
    if limit < 1:
        raise ValueError(
            f"the worker thread limit must be 1 or more, got {limit}: a sync step function"
            " runs in a worker thread (give its step run_in_thread=False to run it on the"
            " event loop instead)"
        )
    with _pools_lock:
        previous, _max_workers = _max_workers, limit
        pools = [*_pools.values(), _shared]
    failed: BaseException | None = None
    for pool in pools:
        try:
            _fit(pool)
        except BaseException as exc:  # no thread could start: the other pools still fit
            failed = failed or exc
    if failed is not None:
        raise failed
    return previous


def _fit(pool: _Pool) -> None:
    """End the idle workers beyond the limit, or start workers for calls waiting within it."""
    with pool.lock:
        ending = min(pool.idle, max(0, pool.workers - _max_workers))
        pool.idle -= ending
        pool.workers -= ending
        starting = min(pool.backlog, max(0, _max_workers - pool.workers))
        pool.backlog -= starting
        pool.workers += starting
    for _ in range(ending):
        pool.jobs.put(None)
    for started in range(starting):
        try:
            _start(pool)
        except BaseException:
            unserved = starting - started
            with pool.lock:
                # The calls no new worker serves go to workers that went idle meanwhile,
                # else wait their turn again: never idle workers beside a backlog.
                pool.workers -= unserved
                taken = min(pool.idle, unserved)
                pool.idle -= taken
                pool.backlog += unserved - taken
            raise


def _start(pool: _Pool) -> None:
    # Numbered across all pools, so that a name in a traceback or a thread dump is one thread.
    name = f"little_es-worker-{next(_numbers)}"
    threading.Thread(target=_serve, args=(pool,), name=name, daemon=True).start()


def _serve(pool: _Pool) -> None:
    while True:
        try:
            job: _Job | None = pool.jobs.get(timeout=_IDLE_SECONDS)
        except queue.Empty:
            with pool.lock:
                # Idle and promised to no call: end. Else a call is on its way to us.
                if pool.idle:
                    pool.idle -= 1
                    pool.workers -= 1
                    return
            continue
        if job is None:  # an idle worker told to end: a lowered limit, or a closed loop
            return
        loop, future, context, fn, args, kwargs = job
        # Dropped before the loop is woken: the local engine extends the outputs it
        # showed a step in place once nothing else holds them (engine/local.py's
        # set_output), so nothing of the call (the step's context) may outlive it here.
        job = None
        result: Any = None
        error: BaseException | None = None
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:  # handed to the caller, as a thread pool does
            error = exc
        del fn, args, kwargs, context
        with pool.lock:
            serving = True
            if pool.backlog and pool.workers <= _max_workers:
                pool.backlog -= 1
            elif pool.workers > _max_workers or pool.closed:
                pool.workers -= 1  # beyond a lowered limit, or its loop is gone
                serving = False
            else:
                pool.idle += 1
        # A loop that closed while the call ran has nobody waiting for it.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, result, error)
        del loop, future, result, error
        if not serving:
            return


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if isinstance(error, StopIteration):
        # A future refuses it with a TypeError, and the caller would wait forever.
        failed = RuntimeError(f"the call raised StopIteration: {error!r}")
        failed.__cause__ = error
        error = failed
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
