"""The local Hub's ASGI app: the routes of `hub_routes`, `event_routes`, `space_routes`, `cas_routes` and
`admin_routes` behind one layer that names each request's route and class, counts it, logs it, applies the quota and
the fault rules.

Order per request: find the route (its name says its class; none found: class `unknown`, answered 404 and logged
loudly) → who is asking (the Hub token's user, or the CAS token's) → quota (429 with `RateLimit` headers once
spent) → fault rule (a `status` answers instead, a `delay` waits, a `drop` cuts the body, an `expired_token` on a CAS
route refuses the token; the events stream takes its own kinds, `event_routes.py`) → the route → count and log one
line when the answer starts (a stream of events is one request, counted as it opens): method, path, query, route,
class, status, user, and the headers that matter (Range, Content-Length, Content-Type, which kind of token).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Match
from starlette.types import Message, Receive, Scope, Send

from . import admin_routes, cas_routes, event_routes, hub_routes, space_routes
from .access import caller_from_header
from .context import Hub
from .counts import RequestRecord
from .faults import ConnectionCut, FaultRule
from .store import Store

#: The fault kinds the app applies itself, by route class or route; the others are the routes' own.
_APP_KINDS = {"api": ("status", "delay", "drop"), "resolver": ("status", "delay", "drop"),
              "unknown": ("status", "delay", "drop"), "cas": ("status", "delay", "drop", "expired_token"),
              event_routes.ROUTE: ("status", "delay")}


class LocalHubApp:
    """The ASGI application `uvicorn` serves (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.hub = Hub(store)
        self.app = Starlette(routes=[*hub_routes.ROUTES, *event_routes.ROUTES, *space_routes.ROUTES,
                                       *cas_routes.ROUTES, *admin_routes.ROUTES])
        self.app.state.hub = self.hub

    def route_of(self, scope: Scope) -> str:
        """The name of the route serving this request; `unknown` when no route matches path and method."""
        for route in self.app.router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.name
        return "unknown"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = self.route_of(scope)
        cls = route.split(".", 1)[0]
        if cls == "admin":
            await self.app(scope, receive, send)
            return
        scope["local_hub.route"] = route
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        user, token, token_kind = self._who(headers, cls)
        method, path = scope["method"], scope["path"]
        recorded = False
        client = (scope.get("client") or ("?", 0))[0]
        allowed, extra_headers = self.hub.quota.check(
            self.hub.store.settings.quota, user if user != "anonymous" else f"ip:{client}", cls, time.time()
        )

        def record(status: int) -> None:
            nonlocal recorded
            recorded = True
            entry = RequestRecord(method, path, scope.get("query_string", b"").decode(), route, cls, user, status,
                                  headers.get("range"))
            self.hub.counts.record(entry, token)
            self._log(entry, headers, token_kind)

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [
                    (k.encode(), v.encode()) for k, v in extra_headers.items()
                ]
                record(message["status"])
            await send(message)

        try:
            if not allowed:
                await _answer(recording_send, 429, {"X-Error-Message": f"You have exceeded the '{cls}' rate limit"},
                              f"429 Too Many Requests: you have reached your '{cls}' rate limit")
            else:
                kinds = _APP_KINDS.get(route, _APP_KINDS.get(cls, ()))
                rule = self.hub.faults.take(kinds, route, cls, method, path)
                await self._serve(rule, scope, receive, recording_send)
        except ConnectionCut:
            pass  # returning without completing the response makes uvicorn close the connection
        finally:
            if not recorded:  # no answer started (the route failed before it)
                record(0)

    async def _serve(self, rule: FaultRule | None, scope: Scope, receive: Receive, send: Send) -> None:
        if rule is not None and rule.delay_s:
            await asyncio.sleep(rule.delay_s)
        if rule is None or rule.kind == "delay":
            await self.app(scope, receive, send)
        elif rule.kind == "status":
            await _answer(send, rule.status, rule.response_headers(), rule.message or f"injected HTTP {rule.status}")
        elif rule.kind == "expired_token":
            scope["local_hub.expired_token"] = True
            await self.app(scope, receive, send)
        elif rule.kind == "drop":
            await self.app(scope, receive, _dropping(send, rule.drop_fraction))

    def _who(self, headers: dict[str, str], cls: str) -> tuple[str, str | None, str]:
        """(user for the counts, token for the counts, what kind of credential was sent, for the log)."""
        authorization = headers.get("authorization")
        if not authorization:
            return "anonymous", None, "none"
        if cls == "cas":
            xet = self.hub.store.xet_tokens.get(authorization.removeprefix("Bearer ").strip())
            return (xet.user or "anonymous") if xet else "anonymous", authorization[7:], "xet" if xet else "bad-xet"
        caller = caller_from_header(self.hub.store, authorization)
        return caller.user or "anonymous", caller.token, "bad-hub" if caller.bad_token else f"hub-{caller.scope}"

    def _log(self, record: RequestRecord, headers: dict[str, str], token_kind: str) -> None:
        query = f"?{record.query}" if record.query else ""
        keys = " ".join(f"{k}={headers[k]}" for k in ("range", "content-length", "content-type") if k in headers)
        line = (f"{record.method} {record.path}{query} -> {record.status} [{record.cls} {record.route}] "
                f"user={record.user} auth={token_kind} {keys} ua={headers.get('user-agent', '')[:60]}")
        if record.cls == "unknown":
            self.hub.log.warning("UNKNOWN ROUTE %s", line)
        else:
            self.hub.log.info("%s", line)


async def _answer(send: Send, status: int, headers: dict[str, str], message: str) -> None:
    """A JSON `{"error": message}` answer with `headers`."""
    body = json.dumps({"error": message}).encode()
    all_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    all_headers += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": all_headers})
    await send({"type": "http.response.body", "body": body})


def _dropping(send: Send, fraction: float) -> Any:
    """A `send` that holds the response, then sends its headers with the full Content-Length and only `fraction`
    of its body, and raises `ConnectionCut`."""
    held: dict[str, Any] = {}
    body = bytearray()

    async def dropping_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            held.update(message)
            return
        body.extend(message.get("body", b""))
        if message.get("more_body"):
            return
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": held["status"], "headers": headers})
        await send({"type": "http.response.body", "body": bytes(body[: int(len(body) * fraction)]), "more_body": True})
        raise ConnectionCut

    return dropping_send
