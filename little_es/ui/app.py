"""The ASGI app of ``little ui`` (Starlette): read-only pages of one open world.

Routes:

* ``/`` - the runs list; ``?status=running|waiting|failed|completed`` filters it;
* ``/runs/{run_id}`` - a run's page; ``?part=body`` returns only the part the live
  view swaps in;
* ``/api/runs/{run_id}`` - ``{"run_id", "status", "event_count", "updated_at"}`` from the
  runs read model, which the live view polls;
* ``/loops`` - the outer loops list; ``/loops/{outer_loop_id}`` - a loop's cycles;
* each :class:`ExtraPage` given to :func:`create_app`, with its link in the navigation bar.

The world is read from one thread at a time (a lock around every read, each run in a
worker thread so the event loop stays free), and nothing but the runs read model's
catch-up writes to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from little_es.errors import (
    InvalidRunIdError,
    LittleEsError,
    OuterLoopNotFoundError,
    RunNotFoundError,
)
from little_es.projections import RunsProjection
from little_es.ui.html import (
    document,
    error_body,
    loop_body,
    loops_body,
    run_body,
    run_document_body,
    runs_body,
)
from little_es.ui.pages import (
    RUN_FILTERS,
    live_status,
    loop_page,
    loops_list,
    run_page,
    runs_list,
)
from little_es.world import World

__all__ = ["ExtraPage", "create_app"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ExtraPage:
    """A page more for the app: served at ``path``, linked as ``title`` in the navigation bar.

    ``render(world, query)`` returns the page's body as HTML (escaped by the page, see
    :func:`little_es.ui.html.esc`); it is called under the world's lock.
    """

    path: str
    title: str
    render: Callable[[World, Mapping[str, str]], str]


def create_app(world: World, *, extra_pages: Sequence[ExtraPage] = ()) -> Starlette:
    """The read-only web app over ``world`` (which the caller opens and closes)."""
    if not isinstance(world, World):
        raise TypeError(f"create_app needs a World (from open_world()), got {type(world).__name__}")
    lock = threading.Lock()
    # One projection for the app's lifetime: each request only catches it up.
    projection = RunsProjection(world)
    nav = [("/", "runs"), ("/loops", "outer loops"), *((p.path, p.title) for p in extra_pages)]

    async def read(fn: Callable[[], T]) -> T:
        def locked() -> T:
            with lock:
                return fn()

        return await anyio.to_thread.run_sync(locked)

    def page(title: str, body: str, status: int = 200, *, live: bool = False) -> HTMLResponse:
        return HTMLResponse(
            document(title, body, world=world.name, nav=nav, live=live), status_code=status
        )

    async def runs(request: Request) -> Response:
        wanted = request.query_params.get("status") or None
        if wanted is not None and wanted not in RUN_FILTERS:
            known = ", ".join(RUN_FILTERS)
            return page("runs", error_body(f"no filter {wanted!r}: use {known}"), 404)
        found = await read(lambda: runs_list(world, wanted, projection=projection))
        return page("runs", runs_body(found, wanted))

    async def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            gathered = await read(lambda: run_page(world, run_id))
        except (InvalidRunIdError, RunNotFoundError) as exc:
            return page("no such run", error_body(str(exc)), 404)
        if request.query_params.get("part") == "body":
            return HTMLResponse(run_body(gathered))
        return page(f"run {run_id}", run_document_body(gathered), live=True)

    async def loops(request: Request) -> Response:
        return page("outer loops", loops_body(await read(lambda: loops_list(world))))

    async def loop(request: Request) -> Response:
        loop_id = request.path_params["loop_id"]
        try:
            gathered = await read(lambda: loop_page(world, loop_id))
        except (InvalidRunIdError, OuterLoopNotFoundError) as exc:
            return page("no such outer loop", error_body(str(exc)), 404)
        return page(f"outer loop {loop_id}", loop_body(gathered))

    async def api_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        status = await read(lambda: live_status(world, run_id, projection=projection))
        if status is None:
            return JSONResponse({"error": f"no run {run_id!r} in this world"}, status_code=404)
        return JSONResponse(
            {
                "run_id": status.run_id,
                "status": status.status,
                "event_count": status.event_count,
                "updated_at": status.updated_at.isoformat() if status.updated_at else None,
            }
        )

    def extra(p: ExtraPage) -> Callable[[Request], object]:
        async def endpoint(request: Request) -> Response:
            query = dict(request.query_params)
            return page(p.title, await read(lambda: p.render(world, query)))

        return endpoint

    routes = [
        Route("/", runs),
        Route("/runs/{run_id}", run),
        Route("/api/runs/{run_id}", api_run),
        Route("/loops", loops),
        Route("/loops/{loop_id}", loop),
        *(Route(p.path, extra(p)) for p in extra_pages),
    ]

    async def unreadable(request: Request, exc: Exception) -> Response:
        # What `little runs` says in one line (an event type not imported, a tampered
        # log): a page that says it, not a bare 500 and a traceback in the server's log.
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": str(exc)}, status_code=500)
        return page("cannot read the world", error_body(str(exc)), 500)

    return Starlette(routes=routes, exception_handlers={LittleEsError: unreadable})
