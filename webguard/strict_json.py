"""Strict JSON in.

Python's ``json`` accepts ``NaN``/``Infinity`` and lone surrogates (``"\\ud800"``), which later fail
to encode in a response or a log and turn into 500s. :func:`loads_strict` refuses them, and
:class:`StrictRoute` makes FastAPI parse request bodies with it, so they become 422s (answered by
`webguard.answers`, without the offending input).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute


class StrictJSONError(json.JSONDecodeError):
    """JSON that Python's parser accepts but that is not portable JSON (NaN, Infinity, lone surrogates,
    bytes that are not UTF-8). A JSONDecodeError, so FastAPI answers it with 422."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "", 0)


def _refuse_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not a JSON number: send finite numbers only")


def loads_strict(data: str | bytes) -> Any:
    """``json.loads`` that refuses NaN/Infinity, lone surrogates and bytes that are not UTF-8.

    Raises:
        json.JSONDecodeError: the input is not strict JSON (StrictJSONError for the cases above).
    """
    if isinstance(data, (bytes, bytearray)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise StrictJSONError("the body is not UTF-8 text") from None
    try:
        value = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise StrictJSONError("the JSON is nested too deeply") from None
    _check_strings(value)
    return value


def _check_strings(value: Any) -> None:
    """Refuse strings that hold a lone surrogate (they cannot be encoded as UTF-8). Iterative: no
    recursion limit to hit on deep input that the parser accepted."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise StrictJSONError("a string holds a lone surrogate (\\ud800-\\udfff): send valid Unicode") from None


class _StrictRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads_strict(await self.body())
        return self._json


class StrictRoute(APIRoute):
    """An APIRoute whose JSON bodies are parsed by :func:`loads_strict`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictRequest(request.scope, request.receive))

        return strict
