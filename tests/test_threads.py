"""The worker threads of sync step functions and sync tools (``little_es._threads``).

What ``asyncio.to_thread`` promised, which they replace: the call runs off the
loop, in a copy of the caller's context, and hands back its result or its
exception. And what they add: at most ``set_max_worker_threads``'s limit of calls
at once (``min(32, CPUs + 4)`` unless changed) with every further call served in
turn, idle workers that end without losing a call, a forked child that starts its
own, and nothing of a call kept once it returned.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import little_es._threads as threads
from little_es import max_worker_threads, set_max_worker_threads
from little_es._threads import run_in_worker

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_threads_var", default="unset")


async def _call(fn: Any, *args: Any) -> Any:
    return await asyncio.wait_for(run_in_worker(fn, *args), 10)


@pytest.fixture
def limit() -> Iterator[Callable[[int], int]]:
    """``set_max_worker_threads``, the limit put back as it was after the test."""
    before = max_worker_threads()
    yield set_max_worker_threads
    set_max_worker_threads(before)


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for what the worker threads do (the loop, if any, is not needed for it)."""
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, f"still not {what} after 10 s"
        time.sleep(0.01)


def test_a_call_runs_off_the_loop_in_a_copy_of_the_callers_context() -> None:
    def where() -> tuple[int, str]:
        seen = _VAR.get()
        _VAR.set("changed in the worker")
        return threading.get_ident(), seen

    async def main() -> tuple[int, str, str]:
        _VAR.set("the caller's")
        ident, seen = await run_in_worker(where)
        return ident, seen, _VAR.get()

    ident, seen, after = asyncio.run(main())
    assert ident != threading.get_ident()
    assert seen == "the caller's"
    assert after == "the caller's"


def test_arguments_and_keywords_reach_the_function_and_its_exception_the_caller() -> None:
    def add(a: int, b: int, *, scale: int) -> int:
        return (a + b) * scale

    def fail(message: str) -> None:
        raise LookupError(message)

    async def main() -> int:
        with pytest.raises(LookupError, match="not here") as caught:
            await run_in_worker(fail, "not here")
        assert caught.traceback[-1].name == "fail"
        return await run_in_worker(add, 1, 2, scale=10)

    assert asyncio.run(main()) == 30


def test_the_loop_goes_on_while_a_call_blocks() -> None:
    release = threading.Event()
    ticks: list[int] = []

    async def tick() -> None:
        for i in range(5):
            ticks.append(i)
            await asyncio.sleep(0.01)
        release.set()

    async def main() -> bool:
        blocked = run_in_worker(release.wait, 10.0)
        await tick()
        return await blocked

    assert asyncio.run(main()) is True
    assert ticks == [0, 1, 2, 3, 4]


def test_at_most_max_workers_calls_run_at_once_and_every_further_one_is_served() -> None:
    lock = threading.Lock()
    running = 0
    most = 0

    def busy(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return i

    calls = threads._max_workers * 2 + 3

    async def main() -> tuple[list[int], tuple[int, int, int]]:
        done = await asyncio.gather(*(run_in_worker(busy, i) for i in range(calls)))
        pool = threads._pool_of(asyncio.get_running_loop())
        return list(done), (pool.backlog, pool.idle, pool.workers)

    done, counts = asyncio.run(asyncio.wait_for(main(), 30))
    assert done == list(range(calls))
    assert most == threads._max_workers == threads.DEFAULT_MAX_WORKER_THREADS
    # Every worker is idle again, promised nothing: the next calls start no new one.
    assert counts == (0, threads._max_workers, threads._max_workers)


def test_a_raised_limit_starts_the_calls_waiting_their_turn(
    limit: Callable[[int], int],
) -> None:
    release = threading.Event()
    started: list[int] = []

    def held(i: int) -> int:
        started.append(i)
        release.wait(10)
        return i

    async def main() -> list[int]:
        limit(2)
        calls = asyncio.gather(*(run_in_worker(held, i) for i in range(5)))
        _until(lambda: len(started) == 2, "two started")
        await asyncio.sleep(0.1)
        assert len(started) == 2  # the other three wait their turn
        assert limit(5) == 2
        assert max_worker_threads() == 5
        _until(lambda: len(started) == 5, "all five started")  # none finished
        release.set()
        return list(await calls)

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2, 3, 4]


def test_a_lowered_limit_holds_for_later_calls_and_the_workers_beyond_it_end(
    limit: Callable[[int], int],
) -> None:
    lock = threading.Lock()
    release = threading.Event()
    running = 0
    seen_by_later: list[int] = []

    def call(later: bool) -> None:
        nonlocal running
        with lock:
            running += 1
            if later:
                seen_by_later.append(running)
        if not later:
            release.wait(10)
        time.sleep(0.02)
        with lock:
            running -= 1

    async def main() -> None:
        limit(4)
        pool = threads._pool_of(asyncio.get_running_loop())
        first = asyncio.gather(*(run_in_worker(call, False) for _ in range(4)))
        _until(lambda: running == 4, "four running")
        limit(1)
        later = asyncio.gather(*(run_in_worker(call, True) for _ in range(3)))
        await asyncio.sleep(0.1)
        assert seen_by_later == []  # four run, over the new limit: none starts
        release.set()
        await first
        await later
        # Each later call ran alone, and three of the four workers ended as they finished.
        assert seen_by_later == [1, 1, 1]
        assert (pool.workers, pool.idle, pool.backlog) == (1, 1, 0)

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_lowered_limit_ends_the_idle_workers_beyond_it(limit: Callable[[int], int]) -> None:
    before = _workers()

    async def main() -> None:
        limit(4)
        pool = threads._pool_of(asyncio.get_running_loop())
        together = threading.Barrier(4, timeout=10)
        await asyncio.gather(*(run_in_worker(together.wait) for _ in range(4)))
        assert (pool.workers, pool.idle) == (4, 4)
        ours = [t for t in _workers() if t not in before]
        assert len(ours) == 4
        limit(2)
        assert (pool.workers, pool.idle) == (2, 2)
        _until(lambda: sum(t.is_alive() for t in ours) == 2, "two workers ended")
        # The two left serve on, at most two calls at once.
        assert sorted(await asyncio.gather(*(run_in_worker(abs, -i) for i in range(6)))) == [
            0,
            1,
            2,
            3,
            4,
            5,
        ]
        assert (pool.workers, pool.idle, pool.backlog) == (2, 2, 0)

    asyncio.run(asyncio.wait_for(main(), 30))


@pytest.mark.parametrize("wrong", ["4", 2.0, True, None])
def test_a_limit_that_is_no_int_is_refused(wrong: Any, limit: Callable[[int], int]) -> None:
    with pytest.raises(TypeError, match="the worker thread limit must be an int"):
        limit(wrong)
    assert max_worker_threads() == threads.DEFAULT_MAX_WORKER_THREADS


@pytest.mark.parametrize("wrong", [0, -3])
def test_a_limit_under_one_is_refused(wrong: int, limit: Callable[[int], int]) -> None:
    with pytest.raises(ValueError, match=r"must be 1 or more.*run_in_thread=False"):
        limit(wrong)
    assert max_worker_threads() == threads.DEFAULT_MAX_WORKER_THREADS


def test_a_call_that_runs_a_loop_of_its_own_gets_that_loops_workers() -> None:
    # Every worker of the outer loop is held by a call that waits for a call of its own
    # loop: with one pool for all loops, those would wait forever.
    everyone = threading.Barrier(threads._max_workers, timeout=10)

    def outer(i: int) -> int:
        everyone.wait()
        return int(asyncio.run(_call(int, str(i))))

    async def main() -> list[int]:
        calls = (run_in_worker(outer, i) for i in range(threads._max_workers))
        return list(await asyncio.wait_for(asyncio.gather(*calls), 20))

    assert asyncio.run(main()) == list(range(threads._max_workers))


def test_idle_workers_end_and_a_later_call_starts_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "_IDLE_SECONDS", 0.05)

    async def main() -> int:
        await asyncio.gather(*(run_in_worker(time.sleep, 0.02) for _ in range(3)))
        pool = threads._pool_of(asyncio.get_running_loop())
        assert pool.workers == 3
        for _ in range(1000):
            if not pool.workers:
                break
            await asyncio.sleep(0.01)
        assert (pool.workers, pool.idle) == (0, 0)
        return int(await _call(sum, [1, 2]))

    assert asyncio.run(main()) == 3


def test_a_cancelled_caller_leaves_the_call_to_finish_and_the_worker_to_serve_on() -> None:
    release = threading.Event()
    finished = threading.Event()

    def slow() -> str:
        release.wait(10)
        finished.set()
        return "late"

    async def main(loop_errors: list[dict[str, Any]]) -> str:
        asyncio.get_running_loop().set_exception_handler(lambda _, c: loop_errors.append(c))
        waiting = asyncio.ensure_future(run_in_worker(slow))
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        release.set()
        while not finished.is_set():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the result arrives at a cancelled future: dropped
        return await run_in_worker(str.upper, "next")

    errors: list[dict[str, Any]] = []
    assert asyncio.run(main(errors)) == "NEXT"
    assert errors == []


def _workers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("little_es-worker-")}


def test_a_call_whose_loop_closed_ends_its_worker_once_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()
    failures: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", failures.append)
    before = _workers()

    async def abandon() -> None:
        run_in_worker(release.wait, 10.0)
        await asyncio.sleep(0)

    asyncio.run(abandon())  # the loop closes while the call still runs
    ours = _workers() - before
    assert len(ours) == 1
    # Another loop's first call finds the closed one (still held by the running call).
    assert asyncio.run(_call(len, "four")) == 4
    release.set()
    # Nobody can wait for its result, and no call can come to it: it ends, quietly.
    _until(lambda: not any(t.is_alive() for t in ours), "ended")
    assert failures == []


def test_the_workers_of_closed_loops_end_without_waiting_out_the_idle_timeout() -> None:
    # Each asyncio.run is a loop, and a pool, of its own: their idle workers would each
    # wait the idle timeout (30 s) for calls that cannot come.
    before = _workers()
    for i in range(40):
        assert asyncio.run(_call(abs, -i)) == i
    _until(lambda: len(_workers() - before) == 0, "every worker ended")


def test_worker_names_are_unique_across_loops() -> None:
    def name() -> str:
        return threading.current_thread().name

    names = [asyncio.run(_call(name)) for _ in range(3)]
    assert len(set(names)) == 3 and all(n.startswith("little_es-worker-") for n in names)


def test_a_stop_iteration_reaches_the_caller_as_a_runtime_error() -> None:
    def empty() -> int:
        return next(iter([]))

    async def main() -> None:
        with pytest.raises(RuntimeError, match="StopIteration") as caught:
            await _call(empty)
        assert isinstance(caught.value.__cause__, StopIteration)

    asyncio.run(main())


def test_idle_timeouts_racing_new_calls_lose_none(monkeypatch: pytest.MonkeyPatch) -> None:
    # Workers time out while calls arrive: one that ends while a call is promised to it
    # would leave that call waiting forever.
    monkeypatch.setattr(threads, "_IDLE_SECONDS", 0.0005)

    async def main() -> int:
        done = 0
        for i in range(600):
            done += len(await asyncio.gather(*(run_in_worker(abs, j) for j in range(i % 4 + 1))))
            if i % 3 == 0:
                await asyncio.sleep(0.0005 * (i % 5))
        return done

    assert asyncio.run(asyncio.wait_for(main(), 30)) == sum(i % 4 + 1 for i in range(600))


def test_a_thread_that_cannot_start_leaves_the_waiting_calls_served(
    limit: Callable[[int], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def held(i: int) -> int:
        release.wait(10)
        return i

    async def main() -> list[int]:
        limit(1)
        pool = threads._pool_of(asyncio.get_running_loop())
        calls = asyncio.gather(*(run_in_worker(held, i) for i in range(4)))
        _until(lambda: pool.backlog == 3, "three waiting")

        def cannot(pool: threads._Pool) -> None:
            raise RuntimeError("can't start new thread")

        with monkeypatch.context() as m:
            m.setattr(threads, "_start", cannot)
            with pytest.raises(RuntimeError, match="can't start new thread"):
                limit(4)
        assert (pool.workers, pool.idle, pool.backlog) == (1, 0, 3)
        release.set()
        return list(await calls)  # the one worker serves them in turn

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2, 3]


def test_nothing_of_a_call_outlives_it_in_the_worker() -> None:
    class Held:
        pass

    def use(held: Held, *, also: Held) -> int:
        return 1

    async def main() -> tuple[weakref.ref[Held], weakref.ref[Held]]:
        first, second = Held(), Held()
        refs = weakref.ref(first), weakref.ref(second)
        future = run_in_worker(use, first, also=second)
        del first, second
        await future
        return refs

    gc.disable()  # freed by reference counts alone, the moment the worker lets go
    try:
        refs = asyncio.run(main())
        assert [r() for r in refs] == [None, None]
    finally:
        gc.enable()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX-only")
def test_a_forked_child_starts_its_own_workers() -> None:
    # The child goes on with a loop it inherited, as a multiprocessing child may: its
    # pool counted a worker idle that the child does not have.
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(_call(int, "1"))
        assert threads._pool_of(loop).idle >= 1
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit code
            code = 1
            try:
                code = 0 if loop.run_until_complete(_call(int, "7")) == 7 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        loop.close()


def test_a_process_exits_without_waiting_for_a_call_still_running() -> None:
    # asyncio.to_thread's executor is waited for when asyncio.run ends: this would
    # take the minute the call sleeps.
    script = textwrap.dedent(
        """
        import asyncio, time
        from little_es._threads import run_in_worker

        async def main():
            run_in_worker(time.sleep, 60)
            await asyncio.sleep(0.05)

        asyncio.run(main())
        """
    )
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], timeout=50, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    assert time.monotonic() - started < 30
