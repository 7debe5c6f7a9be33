"""An ASGI middleware that refuses request bodies over a size limit with 413, before reading them whole."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """A request body over the limit (HTTP 413). Raised inside ``receive`` so FastAPI answers it as is."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over this server's limit of {limit} bytes: send less")
        self.limit = limit


class BodyLimit:
    """Refuse HTTP bodies over ``max_bytes``: at once by their Content-Length, else while streaming in.

    A chunked body is counted as it arrives and the request fails as soon as the count passes the
    limit, so at most ``max_bytes`` plus one chunk is ever read.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await _refuse(send, BodyTooLarge(self.max_bytes))
            return
        received = 0
        started = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge as e:  # an app that did not turn it into a response itself
            if started:
                raise
            await _refuse(send, e)


async def _refuse(send: Send, error: BodyTooLarge) -> None:
    body = json.dumps({"detail": error.detail, "error": type(error).__name__}).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
