"""What the provider adapters share (:mod:`little_es.contrib.openai`,
:mod:`little_es.contrib.anthropic`): a model's identity, the check of its request
parameters, and the errors its calls raise.

Each adapter keeps what is its provider's: the client, the wire format, the
usage it reports, and the words of its errors (which names the adapter fills in,
which variable holds the API key).
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import ClassVar

import orjson

from little_es.errors import ModelError
from little_es.values import JSONValue

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Statuses where the same request can succeed later: timeout, conflict, rate limit (and
every 5xx)."""


def retry_after(headers: Mapping[str, str]) -> float | None:
    """The seconds a provider's answer asks a client to wait before it tries again:
    ``retry-after-ms`` (OpenAI's and Anthropic's), else ``Retry-After`` in seconds or as an
    HTTP date; None when it says nothing usable."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            seconds = float(ms) / 1000
        else:
            text = headers.get("retry-after")
            if text is None:
                return None
            try:
                seconds = float(text)
            except ValueError:
                when = email.utils.parsedate_to_datetime(text)
                seconds = (when - datetime.now(UTC)).total_seconds()
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


class ProviderModel:
    """The provider-independent part of an adapter: ``provider``, ``model_id``,
    ``parameters``, and the errors of its calls."""

    _reserved_parameters: ClassVar[frozenset[str]]
    """Keys the adapter fills in itself; a parameter with one of these names would
    silently override the conversation or switch the wire format to streaming."""
    _filled_in: ClassVar[str]
    """What the adapter fills in, in words (the refusal of a reserved parameter says it)."""
    _api_key_variable: ClassVar[str]
    """The environment variable the provider's client reads the API key from."""
    _status_advice: ClassVar[Mapping[int, str]] = {}
    """Advice for refusals of particular statuses, beyond those of every provider."""

    _provider: str
    _model_id: str
    _parameters: Mapping[str, JSONValue]

    @property
    def provider(self) -> str:
        """The provider name used for pricing."""
        return self._provider

    @property
    def model_id(self) -> str:
        """The model name sent with every request."""
        return self._model_id

    @property
    def parameters(self) -> Mapping[str, JSONValue]:
        """The default request parameters given at construction (read-only)."""
        return self._parameters

    @property
    def request_settings(self) -> dict[str, JSONValue]:
        """What this model sends with every request besides the conversation and tools:
        pinned in each session's manifest, so a resume with another (a changed
        temperature) is refused as drift."""
        return dict(self._parameters)

    @classmethod
    def _check_parameters(
        cls, params: dict[str, JSONValue], what: str, error: Callable[[str], Exception]
    ) -> None:
        """Refuse, with ``error``, a reserved key or a value that is not JSON."""
        bad = sorted(
            str(k) for k in params if not isinstance(k, str) or k in cls._reserved_parameters
        )
        if bad:
            raise error(
                f"{what} must not set {', '.join(bad)}: {cls._filled_in} come from the"
                " request and the model id, and streaming is not supported"
            )
        try:
            orjson.dumps(params)
        except TypeError as exc:
            raise error(f"{what} must be JSON values ({exc})") from exc

    def _error(
        self,
        detail: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> ModelError:
        return ModelError(
            f"{self._provider} model {self._model_id!r}: {detail}",
            retryable=retryable,
            provider=self._provider,
            status=status,
            retry_after=retry_after,
        )

    def _parameter_error(self, message: str) -> ModelError:
        return self._error(message, retryable=False)

    def _status_error(
        self, status: int, message: str, headers: Mapping[str, str] | None = None
    ) -> ModelError:
        """The error of a call the provider answered with HTTP ``status`` (and ``headers``)."""
        retryable = status in RETRYABLE_STATUSES or status >= 500
        return self._error(
            f"call failed with HTTP {status}: {message}; {self._advice(status, retryable)}",
            retryable=retryable,
            status=status,
            retry_after=retry_after(headers) if retryable and headers is not None else None,
        )

    def _advice(self, status: int, retryable: bool) -> str:
        if retryable:
            return "the runtime may retry"
        if status in (401, 403):
            return f"check the API key (api_key= or {self._api_key_variable}) and its permissions"
        if status == 404:
            return "check the model id and base_url"
        if status in self._status_advice:
            return self._status_advice[status]
        return "the provider refused the request; check the messages, tools and parameters"
