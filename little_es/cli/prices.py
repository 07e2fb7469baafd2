"""``little prices set | list``: model prices recorded in a world, for every process.

A price set here is a :class:`~little_es.events.ModelPriceSet` event of the
world's price book (:meth:`~little_es.world.World.set_model_price`): every
``little report``, replay and read model of the world prices the model's
calls made from its ``--from`` moment (default: now) on with it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Annotated

import typer

from little_es.cli.common import WorldOption, console, inspection_world
from little_es.errors import PricingError
from little_es.render import render_prices
from little_es.world import open_world

__all__ = ["list_command", "prices_app", "set_command"]

prices_app = typer.Typer(
    name="prices",
    help="Model prices recorded in the world (USD per million tokens).",
    no_args_is_help=True,
)


def _price(name: str, text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        return Decimal(text.strip())
    except InvalidOperation:
        raise PricingError(
            f"--{name} must be a number of US dollars per million tokens, got {text!r}"
        ) from None


def _moment(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise PricingError(
            f"--from must be an ISO 8601 date or time such as 2026-01-01 or"
            f" 2026-01-01T09:00:00+00:00, got {text!r}"
        ) from None
    # A date or time without an offset is UTC, as every timestamp of the log is.
    return moment if moment.utcoffset() is not None else moment.replace(tzinfo=UTC)


@prices_app.command("set")
def set_command(
    provider: Annotated[str, typer.Argument(help="Provider id, e.g. vllm.", show_default=False)],
    model_id: Annotated[
        str, typer.Argument(help="Model id as calls report it.", show_default=False)
    ],
    input_per_mtok: Annotated[
        str, typer.Option("--input", help="USD per million input tokens.", show_default=False)
    ],
    output_per_mtok: Annotated[
        str, typer.Option("--output", help="USD per million output tokens.", show_default=False)
    ],
    cached_input_per_mtok: Annotated[
        str | None,
        typer.Option(
            "--cached-input", help="USD per million cached input tokens [default: --input]."
        ),
    ] = None,
    cache_write_per_mtok: Annotated[
        str | None,
        typer.Option(
            "--cache-write",
            help="USD per million tokens written to the prompt cache [default: --input].",
        ),
    ] = None,
    reasoning_per_mtok: Annotated[
        str | None,
        typer.Option("--reasoning", help="USD per million reasoning tokens [default: --output]."),
    ] = None,
    effective_from: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="ISO date or time the price applies from (UTC if no offset) [default: now].",
        ),
    ] = None,
    world: WorldOption = None,
) -> None:
    """Record a model's price in the world: every process's folds price its calls with it."""
    input_price = _price("input", input_per_mtok)
    output_price = _price("output", output_per_mtok)
    assert input_price is not None and output_price is not None
    with open_world(world) as w:
        event = w.set_model_price(
            provider,
            model_id,
            input_per_mtok=input_price,
            output_per_mtok=output_price,
            cached_input_per_mtok=_price("cached-input", cached_input_per_mtok),
            reasoning_per_mtok=_price("reasoning", reasoning_per_mtok),
            cache_write_per_mtok=_price("cache-write", cache_write_per_mtok),
            effective_from=_moment(effective_from),
        )
        name = w.name
    typer.echo(
        f"recorded {event.provider}/{event.model_id} in world {name}, effective from"
        f" {event.effective_from.isoformat(timespec='seconds')}"
    )


@prices_app.command("list")
def list_command(world: WorldOption = None) -> None:
    """Every price recorded in the world, in the order recorded."""
    with inspection_world(world) as w:
        prices = w.model_prices()
        name = w.name
    render_prices(prices, name, console())
