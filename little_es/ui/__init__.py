"""``little ui``: a local, read-only web page of a world's runs (the ``ui`` extra).

* :mod:`little_es.ui.pages` gathers what a page shows from the log (plain data);
* :mod:`little_es.ui.html` writes it as HTML, escaping every value from the log;
* :mod:`little_es.ui.app` is the Starlette app: :func:`create_app`;
* :func:`serve` runs the app with uvicorn until interrupted (``little ui`` calls it).

Its pages: the runs list, a run, the outer loops list and an outer loop's cycles;
more plug in as an :class:`~little_es.ui.app.ExtraPage` of :func:`create_app`, each
with its own link in the navigation bar.
"""

from __future__ import annotations

from little_es.ui.app import ExtraPage, create_app
from little_es.world import World

__all__ = ["ExtraPage", "create_app", "serve"]


def serve(world: World, *, host: str = "127.0.0.1", port: int = 8008) -> None:
    """Serve :func:`create_app` of ``world`` on ``host:port`` until interrupted."""
    import uvicorn

    uvicorn.run(create_app(world), host=host, port=port, log_level="warning", access_log=False)
