"""The HTTP API, following OpenEnv's conventions so its clients connect: ``POST /reset``,
``POST /step`` and ``GET /state`` carry the session's ``episode_id``; ``WS /ws`` holds one session
per connection exactly like OpenEnv's ``EnvClient`` expects; plus ``/health``, ``/schema``,
``/metadata``, a minimal ``/mcp``, and this Space's ``/stats`` and ``/games``.

Who may do what (with a token set; without one the env is open, as before): a caller with the env token
(``Authorization: Bearer <ENV_TOKEN>``, on the HTTP requests or on the WebSocket's opening request) plays in the
reserved pool and may say which policy plays (``weight_version``). Anyone else is an anonymous visitor: their games are
people's games, in the public pool under per-address caps (429 past them), and a ``weight_version`` from them is
refused with 403."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import HTTPConnection

from webguard import bearer_token, client_address, guard_app, loads_strict, refusal, token_matches, validation_detail
from wire.env import (
    HUMAN,
    CloseResponse,
    EpisodeRequest,
    ExamInfo,
    GameKind,
    GameRecord,
    PlayerStats,
    ResetRequest,
    StepRequest,
    StepResponse,
    WordleAction,
    WordleObservation,
    player_label,
)
from wire.exam import HELD_OUT_SECRETS, MAX_EXAM_TURNS

from .errors import (
    ClientLimitError,
    ForbiddenError,
    GameOverError,
    InvalidSecretError,
    ServerFullError,
    SessionExistsError,
    SessionNotFoundError,
    WordleError,
)
from .exam import copying_reference
from .mcp import add_mcp
from .sessions import SessionStore

#: Largest request body: an action is at most 32 K characters, so this leaves ample room.
MAX_BODY_BYTES = 256 * 1024

_STATUS = {
    ClientLimitError: 429,
    ForbiddenError: 403,
    ServerFullError: 503,
    SessionNotFoundError: 404,
    SessionExistsError: 409,
    GameOverError: 409,
    InvalidSecretError: 422,
}
# OpenEnv's WebSocket error codes.
_WS_CODE = {
    ServerFullError: "CAPACITY_REACHED",
    ClientLimitError: "CAPACITY_REACHED",
    InvalidSecretError: "VALIDATION_ERROR",
    ForbiddenError: "FORBIDDEN",
}
METADATA = {
    "name": "wordle",
    "description": "Wordle: find a 5-letter word in 6 guesses from green/yellow/gray feedback.",
    "version": "0.1.0",
}


@dataclass(frozen=True)
class Access:
    """Who may call the env and how callers are told apart.

    Attributes:
        token: The env token (``--token``/``ENV_TOKEN``). None: an open env, as for a private local run,
            where every caller is treated as a token holder (no caps, labels allowed).
        trust_forwarded: Take the caller's address from the proxy's ``X-Forwarded-For`` (on a Space).
    """

    token: str | None = None
    trust_forwarded: bool = False

    def client(self, headers: Mapping[str, str], peer: str | None) -> str | None:
        """None for a token holder, else the anonymous caller's address (the key of its caps)."""
        if self.token is None or token_matches(bearer_token(headers), self.token):
            return None
        return client_address(headers, peer, self.trust_forwarded)


def _start(store: SessionStore, request: ResetRequest, client: str | None) -> WordleObservation:
    if client is not None and (request.weight_version is not None or request.game_kind != GameKind.PLAY):
        what = "weight_version" if request.weight_version is not None else f"kind {request.game_kind}"
        raise ForbiddenError(
            f"{what} needs the env token (Authorization: Bearer <ENV_TOKEN>); "
            "anonymous games are recorded as a person's: leave weight_version and kind out"
        )
    return store.start(
        player=HUMAN if request.human or client is not None else player_label(request.weight_version),
        seed=request.seed,
        secret=request.secret,
        episode_id=request.episode_id,
        max_invalid_moves=request.max_invalid_moves,
        client=client,
        examples=request.example_probability,
        exam=request.exam,
        kind=request.game_kind,
    )


def build_api(store: SessionStore, access: Access | None = None) -> FastAPI:
    """A FastAPI app serving the games of ``store`` (the UI can be mounted on it afterwards)."""
    access = access or Access()
    app = guard_app(FastAPI(title="Wordle environment", version=METADATA["version"]), MAX_BODY_BYTES)

    @app.exception_handler(WordleError)
    async def _wordle_error(_: Request, exc: WordleError) -> JSONResponse:
        retry = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry)} if retry is not None else None
        return refusal(_STATUS.get(type(exc), 400), str(exc), type(exc).__name__, headers)

    def caller(request: HTTPConnection) -> str | None:
        return access.client(request.headers, request.client.host if request.client else None)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, str]:
        return METADATA

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        observation = WordleObservation.model_json_schema()
        return {"action": WordleAction.model_json_schema(), "observation": observation, "state": observation}

    @app.post("/reset")
    async def reset(http: Request, request: ResetRequest | None = None) -> StepResponse:
        """Start a game. The observation's ``episode_id`` names the session for later calls."""
        return StepResponse.of(_start(store, request or ResetRequest(), caller(http)))

    @app.post("/step")
    async def step(request: StepRequest) -> StepResponse:
        return StepResponse.of(store.step(request.episode_id, request.action.guess))

    @app.get("/state")
    async def state(episode_id: str = Query(min_length=1, max_length=255)) -> WordleObservation:
        return store.observe(episode_id)

    @app.post("/close")
    async def close(request: EpisodeRequest) -> CloseResponse:
        """Drop an unfinished game early (idle games are dropped anyway after the timeout)."""
        store.close(request.episode_id)
        return CloseResponse(episode_id=request.episode_id, closed=True)

    @app.get("/stats")
    async def stats() -> list[PlayerStats]:
        """Games, wins and win rate per player (``human``, ``policy vN``)."""
        return store.history.stats()

    @app.get("/games")
    async def games(
        limit: int = Query(20, ge=1, le=200), policy_only: bool = False, kind: GameKind | None = None
    ) -> list[GameRecord]:
        """The latest finished games, newest first (the policy's only, or of one kind only, if asked)."""
        return store.history.recent(limit, policy_only, kind)

    @app.get("/exam")
    def exam(
        games: int = Query(16, ge=1, le=HELD_OUT_SECRETS), turns: int = Query(3, ge=1, le=MAX_EXAM_TURNS)
    ) -> ExamInfo:
        """The held-out secrets' count, and what a player copying the examples scores on the first `games` of
        them in `turns` moves (the exam's reference line)."""
        return copying_reference(games, turns)

    add_mcp(app, METADATA["name"], METADATA["version"])

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        """OpenEnv's session protocol: messages ``reset``, ``step``, ``state``, ``close`` (JSON text)."""
        await websocket.accept()
        session = _WsSession(store, caller(websocket))
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                reply, stop = (
                    session.handle(text)
                    if text is not None
                    else (_ws_error("INVALID_JSON", "send JSON text frames, not binary ones"), False)
                )
                await websocket.send_text(json.dumps(reply))
                if stop:
                    await websocket.close()
                    break
        except WebSocketDisconnect:
            pass
        finally:
            session.close()

    return app


class _WsSession:
    """The game of one WebSocket connection; a new ``reset`` replaces it, disconnecting drops it."""

    def __init__(self, store: SessionStore, client: str | None) -> None:
        self._store = store
        self._client = client
        self._episode_id: str | None = None

    def handle(self, raw: str) -> tuple[dict[str, Any], bool]:
        """Answer one message: (reply, whether the connection should close). Never raises."""
        try:
            message = loads_strict(raw)
            if not isinstance(message, dict):
                return _ws_error("INVALID_JSON", "a message must be a JSON object"), False
            return self._dispatch(message.get("type"), message.get("data") or {})
        except json.JSONDecodeError as e:
            return _ws_error("INVALID_JSON", f"invalid JSON: {e.msg}"), False
        except ValidationError as e:
            return _ws_error("VALIDATION_ERROR", validation_detail(e.errors())), False
        except WordleError as e:
            return _ws_error(_WS_CODE.get(type(e), "SESSION_ERROR"), str(e)), False

    def _dispatch(self, kind: Any, data: Any) -> tuple[dict[str, Any], bool]:
        if kind == "reset":
            self.close()
            if not isinstance(data, dict):
                return _ws_error("VALIDATION_ERROR", "'data' must be a JSON object"), False
            observation = _start(self._store, ResetRequest.model_validate(data), self._client)
            self._episode_id = observation.episode_id
            return {"type": "observation", "data": StepResponse.of(observation).model_dump()}, False
        if kind == "close":
            return {"type": "closed", "data": {}}, True
        if kind not in ("step", "state"):
            return _ws_error("UNKNOWN_TYPE", f"unknown message type {kind!r}; use reset, step, state or close"), False
        if self._episode_id is None:
            return _ws_error("SESSION_ERROR", "no game yet: send a 'reset' message first"), False
        if kind == "step":
            observation = self._store.step(self._episode_id, WordleAction.model_validate(data).guess)
            return {"type": "observation", "data": StepResponse.of(observation).model_dump()}, False
        return {"type": "state", "data": self._store.observe(self._episode_id).model_dump()}, False

    def close(self) -> None:
        """Free this connection's game if it is still live."""
        if self._episode_id is not None:
            self._store.discard(self._episode_id)
            self._episode_id = None


def _ws_error(code: str, message: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}
