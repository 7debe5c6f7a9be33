"""A small HTTP client of the Wordle env Space (its OpenEnv-shaped ``/reset``, ``/step``, ``/close``).

The rollout Space plays games through it exactly as any other client would, so the env can run
anywhere: another process, another machine, a Space.
"""

from __future__ import annotations

from typing import Any

import httpx

from delta.errors import ReplyLimitError
from webguard import auth_headers
from webguard.calls import exchange, request_json
from wire.env import ExamInfo, GameKind, StepResponse, WordleObservation

from .errors import EnvUnavailableError

#: Most bytes of one reply of the env: an observation is a few KB, `/exam` a list of held-out secrets.
MAX_REPLY_BYTES = 1 << 20


class EnvClient:
    """Talks to one env Space. Thread-safe (httpx clients are).

    Args:
        url: Base URL of the env Space, e.g. ``http://127.0.0.1:7861``.
        timeout: Seconds per request, its reply included (and at most `MAX_REPLY_BYTES` of it).
        token: The env token, sent as a bearer token: the env then plays these games in its reserved
            pool and records them as the policy's (without it, an env with a token refuses them).
    """

    def __init__(self, url: str, timeout: float = 30.0, token: str | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"env URL {url!r} must start with http:// or https:// (set --env-url or ENV_URL)")
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=auth_headers(token))

    def reset(
        self,
        *,
        seed: int | None = None,
        secret: str | None = None,
        weight_version: int | None = None,
        human: bool = False,
        examples: float | None = None,
        exam: int | None = None,
        kind: GameKind | None = None,
    ) -> WordleObservation:
        """Start a game; returns the observation (its ``episode_id`` names the game).

        ``human``: a person plays it (a match against the policy): the env records it as a person's
        game, and invalid moves never end it. ``examples``: the probability that the game's messages show an
        example guess (None: the env's default, every message). ``exam``: play that held-out secret. ``kind``: why
        the game is played, for the env's counts (None: the env's default, exam for an exam, else play).
        """
        body = {
            "seed": seed,
            "secret": secret,
            "weight_version": weight_version,
            "examples": examples,
            "exam": exam,
            "kind": None if kind is None else kind.value,
        }
        body = {k: v for k, v in body.items() if v is not None}
        if human:
            body |= {"human": True, "max_invalid_moves": None}
        return self._post("/reset", body)

    def step(self, episode_id: str, text: str) -> WordleObservation:
        """Play ``text`` as the next move; returns the observation, with the move's ``reward`` and ``done``."""
        return self._post("/step", {"episode_id": episode_id, "action": {"guess": text}})

    def close_game(self, episode_id: str) -> None:
        """Drop an unfinished game (best effort: a game the env already dropped is fine)."""
        try:
            exchange(self._http, "POST", "/close", {"episode_id": episode_id}, MAX_REPLY_BYTES)
        except (httpx.HTTPError, ReplyLimitError):
            pass

    def exam_info(self, games: int, turns: int) -> ExamInfo:
        """The env's ``GET /exam``: its held-out secrets and what copying the examples scores on them.

        Raises:
            EnvUnavailableError: the env did not answer it.
        """
        return request_json(
            self._http,
            "GET",
            f"/exam?games={games}&turns={turns}",
            None,
            what=f"the env Space at {self.url}",
            flag="--env-url",
            error=EnvUnavailableError,
            answer=ExamInfo,
            max_bytes=MAX_REPLY_BYTES,
        )

    def health(self) -> bool:
        """Whether the env answers ``/health``."""
        try:
            return exchange(self._http, "GET", "/health", None, MAX_REPLY_BYTES)[0] == 200
        except (httpx.HTTPError, ReplyLimitError):
            return False

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, body: dict[str, Any]) -> WordleObservation:
        """A step response of the env (``/reset``, ``/step``), its reward and done put in the observation."""
        reply = request_json(
            self._http,
            "POST",
            path,
            body,
            what=f"the env Space at {self.url}",
            flag="--env-url",
            error=EnvUnavailableError,
            answer=StepResponse,
            max_bytes=MAX_REPLY_BYTES,
        )
        return reply.merged()
