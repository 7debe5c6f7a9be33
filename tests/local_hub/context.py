"""The state every route of the local Hub shares, reached as `request.app.state.hub`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from .access import Refusal
from .counts import Counts
from .events import Feeds
from .faults import FaultBook
from .quota import Quota
from .store import Store


@dataclass
class Hub:
    """The store plus what lives only as long as the process: fault rules, counts, quota windows, upload grants, the
    events feed's buffer and open streams."""

    store: Store
    faults: FaultBook = field(default_factory=FaultBook)
    counts: Counts = field(default_factory=Counts)
    quota: Quota = field(default_factory=Quota)
    grants: dict[str, dict[str, Any]] = field(default_factory=dict)
    feeds: Feeds = field(default_factory=Feeds)
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("local_hub"))


def hub_of(request: Request) -> Hub:
    return request.app.state.hub


def base_url(request: Request) -> str:
    """This server as the client reached it (`http://127.0.0.1:PORT`), for URLs the answers carry."""
    return str(request.base_url).rstrip("/")


def refuse(refusal: Refusal) -> JSONResponse:
    """An error answer the way the Hub writes one: JSON `{"error": ...}` plus `X-Error-Code` / `X-Error-Message`."""
    headers = {"X-Error-Message": refusal.message}
    if refusal.code:
        headers["X-Error-Code"] = refusal.code
    return JSONResponse({"error": refusal.message}, status_code=refusal.status, headers=headers)
