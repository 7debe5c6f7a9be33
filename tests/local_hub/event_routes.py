"""`GET /api/buckets/<ns>/<name>/events`: the bucket's changes as server-sent events (`events.py` says what is sent
and what is inferred).

Counted as one `api` request when the stream opens, however long it stays open (the app counts a request when its
answer starts). Refusals come before the stream: the feed turned off (`Settings.events_off`: 501 or 404), no read
access (401, 404 as every bucket route), no `Accept: text/event-stream` (406), a `cursor` or `since` that does not
parse (400); a fault rule of kind `status` or `delay` applies as on any route. Once open, the stream faults
(`faults.py`) act on it: `stream_reset` and `stream_reconnect` when it opens, as soon as they are added, and before
each batch; `stream_delay` and `stream_cut` before each batch.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from . import access
from .context import Hub, hub_of, refuse
from .events import PING, Batch, ResumeError, Stream, parse_resume, sse
from .faults import ConnectionCut

ROUTE = "api.bucket_events"


async def bucket_events(request: Request) -> Response:
    hub = hub_of(request)
    bucket_id = f"{request.path_params['namespace']}/{request.path_params['name']}"
    settings = hub.store.settings
    if settings.events_off is not None:
        return refuse(access.Refusal(settings.events_off, None, "this Hub does not serve bucket events"))
    bucket = hub.store.buckets.get(bucket_id)
    caller = access.caller_from_header(hub.store, request.headers.get("authorization"))
    if refusal := access.check_read(hub.store, caller, bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    if "text/event-stream" not in request.headers.get("accept", ""):
        return refuse(access.Refusal(406, None, "bucket events are sent as text/event-stream only: send that Accept"))
    try:
        resume = parse_resume(request.query_params.get("cursor"), request.query_params.get("since"), hub.feeds.epoch)
    except ResumeError as error:
        return refuse(access.Refusal(400, None, str(error)))
    opened = hub.feeds.open(bucket, resume, time.time(), settings.events_replay_s)
    if opened is None:
        return EventStream(hub, bucket_id, request.url.path, None, [])
    return EventStream(hub, bucket_id, request.url.path, *opened)


class EventStream(Response):
    """One open stream: the replay, `ready`, then each batch as it comes, with pings between (see the module
    docstring). `stream` None: the resume point is older than what is kept, so the stream says `reset` and ends."""

    media_type = "text/event-stream"

    def __init__(self, hub: Hub, bucket_id: str, path: str, stream: Stream | None, replay: list[Batch]) -> None:
        self.status_code, self.background = 200, None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # no body: no Content-Length
        self.hub, self.bucket_id, self.path, self.stream, self.replay = hub, bucket_id, path, stream, replay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        if self.stream is None:
            await self._end(send, "reset", {"reason": "the resume point is older than the replay buffer"})
            return
        watcher = asyncio.create_task(_watch_disconnect(receive, self.stream))
        try:
            await self._serve(self.stream, send)
        finally:
            watcher.cancel()
            self.hub.feeds.close(self.bucket_id, self.stream)

    async def _serve(self, stream: Stream, send: Send) -> None:
        if await self._forced(stream, send):
            return
        for batch in self.replay:
            if not await self._changes(stream, batch, send):
                return
        ready = {"cursor": cursor} if (cursor := self.hub.feeds.cursor(stream.position)) else {}
        await _body(send, sse("ready", ready))
        while True:
            try:
                item = await asyncio.wait_for(stream.inbox.get(), self.hub.store.settings.events_ping_s)
            except TimeoutError:
                await _body(send, PING)
                continue
            if item == Stream.GONE:
                return
            if item == Stream.END:
                await _body(send, b"", more=False)
                return
            if item == Stream.POKE:
                if await self._forced(stream, send):
                    return
            elif isinstance(item, Batch) and not await self._changes(stream, item, send):
                return

    async def _changes(self, stream: Stream, batch: Batch, send: Send) -> bool:
        """Send one batch, as the stream faults say; False when the stream ended instead."""
        if await self._forced(stream, send):
            return False
        if delay := self._fault("stream_delay"):
            await asyncio.sleep(delay.delay_s)
        event = sse("changes", {"cursor": self.hub.feeds.cursor(batch.n), "changes": batch.changes})
        if cut := self._fault("stream_cut"):
            await asyncio.sleep(cut.delay_s)
            await _body(send, event[: int(len(event) * cut.drop_fraction)])
            raise ConnectionCut
        await _body(send, event)
        stream.position = batch.n
        return True

    async def _forced(self, stream: Stream, send: Send) -> bool:
        """End the stream the way a `stream_reset` or `stream_reconnect` rule says, if one applies now."""
        rule = self._fault("stream_reset", "stream_reconnect")
        if rule is None:
            return False
        await asyncio.sleep(rule.delay_s)
        if rule.kind == "stream_reset":
            await self._end(send, "reset", {"reason": rule.message or "forced by a fault rule"})
        else:
            cursor = self.hub.feeds.cursor(stream.position)
            await self._end(send, "reconnect", {"cursor": cursor} if cursor else {})
        return True

    def _fault(self, *kinds: str) -> Any:
        return self.hub.faults.take(kinds, ROUTE, "api", "GET", self.path)

    async def _end(self, send: Send, event: str, data: dict[str, Any]) -> None:
        await _body(send, sse(event, data))
        await _body(send, b"", more=False)


async def _body(send: Send, data: bytes, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})


async def _watch_disconnect(receive: Receive, stream: Stream) -> None:
    """Tell the stream when its client leaves."""
    while (await receive())["type"] != "http.disconnect":
        pass
    stream.inbox.put_nowait(Stream.GONE)


ROUTES = [Route("/api/buckets/{namespace}/{name}/events", bucket_events, methods=["GET"], name=ROUTE)]
