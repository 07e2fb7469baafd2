"""The ``little`` command: inspect and run the workflows of a world.

Every command is registered here: the built-in ones in :func:`_register`, the
plugins' in :func:`_register_plugins`:

* ``little report | replay | events | runs | loops | verify`` - read-only views of the log
  (:mod:`little_es.cli.inspection`);
* ``little run | resume`` - drive a workflow (:mod:`little_es.cli.run`);
* ``little cancel | diff`` - stop a run from outside; compare two runs
  (:mod:`little_es.cli.operate`);
* ``little export | import`` - move a world to another backend as JSONL
  (:mod:`little_es.cli.transfer`);
* ``little fork`` - a new run from a point of another run's history
  (:mod:`little_es.cli.fork`);
* ``little signal`` - send a waiting run its signal (:mod:`little_es.cli.signal`);
* ``little unlock`` - who holds a run's lease; ``--force`` takes it from a
  stuck holder (:mod:`little_es.cli.unlock`);
* ``little ui`` - a local, read-only web page of the world's runs (the ``ui`` extra,
  :mod:`little_es.ui`);
* ``little prices set | list`` - model prices recorded in the world
  (:mod:`little_es.cli.prices`);
* commands of optional extras, found through the entry point group
  :data:`PLUGIN_GROUP`: ``little worker`` comes from the Temporal adapter
  (``little_es_temporal.cli``), ``little trace`` from the ``otel`` extra
  (:mod:`little_es.contrib.otel_cli`). When an extra is not installed its commands
  still exist and fail in one line that says what to install.

Before any command, ``little --import MODULE`` (repeatable; or ``$LITTLE_ES_IMPORT``,
space-separated) imports a module of the user's, so that the event classes it
defines (:class:`~little_es.events.RunEvent` subclasses) are registered: a log
holding one of them cannot be read without its class.

Every command takes ``--world URL`` (``sqlite:///dir``, ``postgresql://...``,
``memory://``); the default is ``$LITTLE_ES_WORLD``, else
``sqlite:///.little-workflow``. A little_es error ends the command with exit
code 1 and one line on stderr, never a traceback.

Adding commands from another package: declare an entry point
``[project.entry-points."little_es.cli"] NAME = "module:register"`` whose
``register(app: typer.Typer) -> None`` declares the commands on ``app``
(reuse :mod:`little_es.cli.common` and :mod:`little_es.render`). Errors raised
by those commands get the same one-line treatment.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Annotated, Any

import typer
import typer.main
from eventsourcing.persistence import PersistenceError
from rich.markup import escape
from typer.core import TyperGroup

from little_es.cli import fork, inspection, operate, prices, run, signal, transfer, ui, unlock
from little_es.cli.common import IMPORT_ENV_VAR, import_modules
from little_es.errors import LittleEsError
from little_es.render import printable

__all__ = ["OPTIONAL_COMMANDS", "PLUGIN_GROUP", "app"]

PLUGIN_GROUP = "little_es.cli"
"""The entry point group whose ``register(app)`` functions add commands to ``little``."""

OPTIONAL_COMMANDS: Mapping[str, str] = MappingProxyType({"worker": "temporal", "trace": "otel"})
"""Commands that come from an optional extra, by name: the extra (and its entry point name)."""


def _one_line(exc: BaseException) -> str:
    # A message may quote a log's text (a cancel reason): no escape sequence reaches stderr.
    return printable(" ".join(str(exc).split())) or type(exc).__name__


class _LittleGroup(TyperGroup):
    """The ``little`` group: loads plugin commands when first needed, reports errors in one line.

    Plugins are loaded when a command that is not built in is looked up, or
    when the commands are listed (``little --help``), so ``little report`` does
    not pay for importing an extra (the Temporal adapter takes ~0.4 s).
    """

    _plugins_loaded = False

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        plugins = typer.Typer()
        _register_plugins(plugins)
        for name, command in typer.main.get_group(plugins).commands.items():
            self.commands.setdefault(name, command)

    # ``Any``: typer vendors click privately, so its classes have no public names.
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """The command ``cmd_name``, built in or from a plugin; None if there is none."""
        if cmd_name not in self.commands:
            self._load_plugins()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: Any) -> list[str]:
        """Every command's name: the built-in ones, then the plugins'."""
        self._load_plugins()
        return super().list_commands(ctx)

    def invoke(self, ctx: Any) -> Any:
        """Run the command; report a little_es error in one line, exit code 1."""
        try:
            return super().invoke(ctx)
        except (LittleEsError, PersistenceError) as exc:
            typer.echo(f"error: {_one_line(exc)}", err=True)
            raise typer.Exit(1) from None


app = typer.Typer(
    name="little",
    cls=_LittleGroup,
    help="Inspect (and run) durable little_es workflows.",
    no_args_is_help=True,
    add_completion=False,
    # A bug's traceback must not print local variables: they may hold a DSN's password.
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _before_any_command(
    modules: Annotated[
        list[str] | None,
        typer.Option(
            "--import",
            metavar="MODULE",
            envvar=IMPORT_ENV_VAR,
            help=(
                "Import this module first (repeatable), so that the event classes it"
                " defines are known: a log holding an event of a class not imported"
                f" cannot be read. [env: ${IMPORT_ENV_VAR}, space-separated]"
            ),
            show_envvar=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    import_modules(modules or ())


def _unavailable(app: typer.Typer, command: str, extra: str, reason: str) -> None:
    """Register ``command`` as a stand-in that says which extra to install, and exits 1."""
    install = f"pip install 'little-es[{extra}]'"

    @app.command(
        command,
        # The help is rich markup, where [temporal] would be a style tag.
        help=f"Not available: needs the {extra} extra ({escape(install)}).",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def stand_in() -> None:
        typer.echo(
            f"error: little {command} needs the {extra} extra, which cannot be loaded"
            f" ({reason}): {install}",
            err=True,
        )
        raise typer.Exit(1)


def _register_plugins(app: typer.Typer) -> None:
    """Add the commands of every installed plugin; stand-ins for optional ones that are not."""
    missing: dict[str, str] = {}
    for entry_point in entry_points(group=PLUGIN_GROUP):
        try:
            register = entry_point.load()
        except ImportError as exc:
            # The extra's dependencies are not installed: its commands get stand-ins below.
            missing[entry_point.name] = _one_line(exc)
            continue
        register(app)
    registered = {info.name for info in app.registered_commands}
    for command, extra in OPTIONAL_COMMANDS.items():
        if command not in registered:
            _unavailable(app, command, extra, missing.get(extra, "not installed"))


def _register(app: typer.Typer) -> None:
    """Every built-in command of ``little``, in the order ``little --help`` lists them.

    Plugin commands follow them; :class:`_LittleGroup` adds those when needed.
    """
    app.command("report")(inspection.report_command)
    app.command("replay")(inspection.replay_command)
    app.command("events")(inspection.events_command)
    app.command("runs")(inspection.runs_command)
    app.command("loops")(inspection.loops_command)
    app.command("verify")(inspection.verify_command)
    app.command("export")(transfer.export_command)
    app.command("import")(transfer.import_command)
    app.command("run")(run.run_command)
    app.command("resume")(run.resume_command)
    app.command("cancel")(operate.cancel_command)
    app.command("diff")(operate.diff_command)
    app.command("fork")(fork.fork_command)
    app.command("signal")(signal.signal_command)
    app.command("unlock")(unlock.unlock_command)
    app.command("ui")(ui.ui_command)
    app.add_typer(prices.prices_app, name="prices")


_register(app)
