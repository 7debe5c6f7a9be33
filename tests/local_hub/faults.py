"""Fault rules: what the local Hub does wrong on purpose, set and cleared over the admin API.

A rule matches a request by route (a route name such as `api.batch`, a prefix such as `cas.*`, a class such as
`cas`, or `*`), optionally by method and by a substring of the path, and applies `times` times (None: until
cleared). Kinds:

- `status`: answer `status` instead of serving (with `Retry-After`, Hub-style `RateLimit` / `RateLimit-Policy`
  headers built from `rate_limit`, any extra `headers`, and a JSON `{"error": message}` body with
  `X-Error-Message`).
- `delay`: wait `delay_s` seconds, then serve normally.
- `drop`: serve, but send the headers (with the full Content-Length) and only `drop_fraction` of the body, then
  close the connection.
- `batch_entry`: in a `batch` call, fail the entries whose path contains `entry` (the others are applied) with
  `message`; the batch answers 200 with them under `failed`, or 422 when every entry failed.
- `expired_token`: on a Xet token route, hand out a token that has already expired; on a CAS route, refuse the
  token as expired (401).

On the events route (`api.bucket_events`), for a stream already open (`event_routes.py`):

- `stream_reset`: the stream sends `reset` (`message` as its reason) and ends, as if its resume point were older
  than the replay buffer; applies when a stream opens, at once to the streams open when the rule is added, and
  before each batch.
- `stream_reconnect`: the stream sends `reconnect` with its cursor and ends (the server rotating); applies as
  `stream_reset` does.
- `stream_delay`: the stream's next batch is sent `delay_s` late (the batches after it wait behind it).
- `stream_cut`: the stream's next batch is sent only in part (`drop_fraction` of the event's bytes), then the
  connection closes.

Every kind may also wait `delay_s` before acting.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Kind = Literal[
    "status", "delay", "drop", "batch_entry", "expired_token", "stream_reset", "stream_reconnect", "stream_delay",
    "stream_cut",
]
KINDS = (
    "status", "delay", "drop", "batch_entry", "expired_token", "stream_reset", "stream_reconnect", "stream_delay",
    "stream_cut",
)


class ConnectionCut(Exception):
    """Raised after a fault sent part of a body (`drop`, `stream_cut`): the app returns without completing the
    response, which makes uvicorn close the connection."""


@dataclass
class FaultRule:
    """One rule; see the module docstring for the kinds. `hits` counts how often it applied."""

    id: int
    kind: Kind
    route: str = "*"
    method: str | None = None
    path_contains: str | None = None
    times: int | None = 1
    status: int = 503
    retry_after: int | None = None
    rate_limit: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    message: str | None = None
    delay_s: float = 0.0
    drop_fraction: float = 0.5
    entry: str | None = None
    hits: int = 0

    def matches(self, route: str, cls: str, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method and self.method.upper() != method:
            return False
        if self.path_contains and self.path_contains not in path:
            return False
        pattern = self.route
        return pattern in ("*", route, cls) or (pattern.endswith(".*") and route.startswith(pattern[:-1]))

    def response_headers(self) -> dict[str, str]:
        """Headers a `status` rule answers with."""
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.rate_limit is not None:
            limit = self.rate_limit
            headers.update(
                ratelimit_headers(
                    limit.get("resource", "api"),
                    remaining=int(limit.get("remaining", 0)),
                    reset_s=int(limit.get("reset", 60)),
                    limit=int(limit.get("limit", 1000)),
                    window_s=int(limit.get("window", 300)),
                )
            )
        if self.message:
            headers["X-Error-Message"] = self.message
        return headers


def ratelimit_headers(resource: str, *, remaining: int, reset_s: int, limit: int, window_s: int) -> dict[str, str]:
    """The Hub's rate-limit headers (IETF draft 9 as the Hub writes them, e.g. `"api";r=0;t=55` and
    `"fixed window";"api";q=500;w=300`; format from huggingface_hub's `parse_ratelimit_headers` and the Hub's
    rate-limit docs)."""
    return {
        "RateLimit": f'"{resource}";r={remaining};t={reset_s}',
        "RateLimit-Policy": f'"fixed window";"{resource}";q={limit};w={window_s}',
    }


class FaultBook:
    """The rules in force, in the order they were added; the first that matches applies."""

    def __init__(self) -> None:
        self.rules: list[FaultRule] = []
        self._next_id = 1

    def add(self, spec: dict[str, Any]) -> FaultRule:
        """Add a rule from its JSON form (the dataclass's fields, less `id` and `hits`).

        Raises:
            ValueError: An unknown kind or field, or a field of the wrong kind for it.
        """
        spec = dict(spec)
        kind = spec.get("kind")
        if kind not in KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(KINDS)}")
        unknown = set(spec) - {f for f in FaultRule.__dataclass_fields__ if f not in ("id", "hits")}
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        if kind == "batch_entry" and not spec.get("entry"):
            raise ValueError("a batch_entry fault needs 'entry', a substring of the entry paths to fail")
        if not 0 <= float(spec.get("drop_fraction", 0.5)) < 1:
            raise ValueError("drop_fraction is the part of the body sent before closing: 0 <= it < 1")
        rule = FaultRule(id=self._next_id, **spec)
        self._next_id += 1
        self.rules.append(rule)
        return rule

    def take(self, kinds: tuple[str, ...], route: str, cls: str, method: str, path: str) -> FaultRule | None:
        """The first rule of one of `kinds` matching this request, counted as applied once."""
        for rule in self.rules:
            if rule.kind in kinds and rule.matches(route, cls, method, path):
                rule.hits += 1
                return rule
        return None

    def take_batch_entry(self, route: str, cls: str, method: str, path: str, entry_path: str) -> FaultRule | None:
        """The first `batch_entry` rule matching this batch call and this entry's path, counted once."""
        for rule in self.rules:
            if (rule.kind == "batch_entry" and rule.entry and rule.entry in entry_path
                    and rule.matches(route, cls, method, path)):
                rule.hits += 1
                return rule
        return None

    def remove(self, rule_id: int) -> bool:
        before = len(self.rules)
        self.rules = [r for r in self.rules if r.id != rule_id]
        return len(self.rules) < before

    def clear(self) -> None:
        self.rules.clear()

    def snapshot(self) -> list[dict[str, Any]]:
        return [asdict(rule) for rule in self.rules]
