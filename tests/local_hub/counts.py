"""Request counts by the Hub's rate-limit classes, so a test can assert what a client costs.

Classes (the Hub's, from huggingface.co/docs/hub/rate-limits, plus the CAS which has none there):
`api` (everything under `/api/`, tree listings, paths-info, batch and Xet token routes included), `resolver`
(`/buckets/.../resolve/...`), `cas` (the Xet CAS routes and the xorb byte ranges its reconstructions point to), and
`unknown` (a route this server does not serve: counted, kept in `unknown`, answered 404). The admin API is not
counted. Counts are kept per class, per route name, per user (the Hub token's user, the CAS token's user, or
`anonymous`, by class and by route) and per token (its last 8 characters), and a ring of the last requests is kept for inspection.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import asdict, dataclass
from typing import Any

CLASSES = ("api", "resolver", "cas", "unknown")


@dataclass(frozen=True)
class RequestRecord:
    """One request as logged: what came in, which route took it and what went out."""

    method: str
    path: str
    query: str
    route: str
    cls: str
    user: str
    status: int
    range: str | None = None


class Counts:
    """Counters since the last `reset()`."""

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self.reset()

    def reset(self) -> None:
        self.by_class: Counter[str] = Counter()
        self.by_route: Counter[str] = Counter()
        self.by_user: dict[str, Counter[str]] = {}
        self.by_token: dict[str, Counter[str]] = {}
        self.by_user_route: dict[str, Counter[str]] = {}
        self.unknown: list[dict[str, Any]] = []
        self.recent: deque[RequestRecord] = deque(maxlen=self._keep)

    def record(self, record: RequestRecord, token: str | None) -> None:
        self.by_class[record.cls] += 1
        self.by_route[record.route] += 1
        self.by_user.setdefault(record.user, Counter())[record.cls] += 1
        self.by_user_route.setdefault(record.user, Counter())[record.route] += 1
        if token:
            self.by_token.setdefault(token[-8:], Counter())[record.cls] += 1

        if record.cls == "unknown":
            self.unknown.append(asdict(record))
        self.recent.append(record)

    def snapshot(self) -> dict[str, Any]:
        """The counters as JSON-ready dicts; every class is present, zero when unseen."""
        return {
            "classes": {cls: self.by_class.get(cls, 0) for cls in CLASSES},
            "routes": dict(sorted(self.by_route.items())),
            "users": {user: dict(counter) for user, counter in sorted(self.by_user.items())},
            "tokens": {token: dict(counter) for token, counter in sorted(self.by_token.items())},
            "user_routes": {user: dict(counter) for user, counter in sorted(self.by_user_route.items())},
            "unknown": list(self.unknown),
        }

    def requests(self) -> list[dict[str, Any]]:
        return [asdict(record) for record in self.recent]
