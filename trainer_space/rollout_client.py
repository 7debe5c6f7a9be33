"""The trainer's client of the rollout Space's HTTP API (local or remote Spaces alike), as the rollout ships its
client of the env (``rollout_space.env_client``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import httpx

from webguard import auth_headers
from webguard.calls import Answer, request_json
from wire.errors import RolloutError, RolloutRefusedError
from wire.rollout import GenerateResponse, RolloutResponse, RolloutStatus, Trajectory

#: Most bytes of one reply: a `/rollout` answer at a server's default caps (256 games of 6 replies of 1,024 tokens,
#: their ids, logprobs and masks as JSON) is about 50 MB.
MAX_REPLY_BYTES = 256 << 20


class RolloutClient:
    """Talks to one rollout server. Its methods raise `RolloutRefusedError` when the server refuses the
    request itself (token, caps, body) and `RolloutError` for any other failure.

    Args:
        url: Base URL, e.g. ``http://127.0.0.1:7862`` or ``https://user-rollout.hf.space``.
        timeout: Seconds per request, its reply included (games on a CPU take a while); at most `MAX_REPLY_BYTES`
            of reply.
        token: The rollout token (``ROLLOUT_TOKEN``), sent as a bearer token: a rollout server started
            with ``--token`` refuses ``/generate`` and ``/rollout`` without it.
    """

    def __init__(self, url: str, timeout: float = 600.0, token: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"rollout URL {url!r} must start with http:// or https:// (set --rollout-url or ROLLOUT_URL)"
            )
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=auth_headers(token))

    def status(self) -> RolloutStatus:
        """`GET /status`: served `version`, `latest_version`, `lag`, `engine`, `last_error`, ..."""
        return self._call("GET", "/status", None, RolloutStatus)

    def generate(self, prompts: Sequence[str | Sequence[int]], **sampling: Any) -> GenerateResponse:
        """`POST /generate`: one completion per prompt (`max_tokens`, `temperature`, `top_p`, `seed`, `stop`)."""
        return self._call(
            "POST",
            "/generate",
            {"prompts": [p if isinstance(p, str) else list(p) for p in prompts], **sampling},
            GenerateResponse,
        )

    def rollout(self, games: Sequence[dict[str, Any]], **sampling: Any) -> list[Trajectory]:
        """`POST /rollout`: one trajectory per game (`{"seed": s}` or `{"secret": w}`), same order.

        Sampling keywords: `max_tokens` (per reply), `temperature`, `top_p`, `seed`, `max_turns`, `reply_prefix`.
        """
        return self._call("POST", "/rollout", {"games": list(games), **sampling}, RolloutResponse).trajectories

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None, answer: type[Answer]) -> Answer:
        return request_json(
            self._http,
            method,
            path,
            body,
            what=f"the rollout server at {self.url}",
            flag="--rollout-url",
            error=RolloutError,
            answer=answer,
            max_bytes=MAX_REPLY_BYTES,
            refused=RolloutRefusedError,
        )
