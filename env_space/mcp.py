"""A minimal MCP endpoint (JSON-RPC 2.0 over ``POST /mcp``), so OpenEnv's ``openenv validate --url``
finds one. It answers ``initialize``, ``ping`` and ``tools/list`` (no tools: games are played over
``/reset``/``/step`` or ``/ws``); anything else gets a JSON-RPC error, always with HTTP 200."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

PROTOCOL_VERSION = "2025-06-18"


def add_mcp(app: FastAPI, name: str, version: str) -> None:
    """Add ``POST /mcp`` to ``app`` (strict JSON when the app went through ``webguard.guard_app``)."""

    results = {
        "initialize": {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": name, "version": version},
        },
        "ping": {},
        "tools/list": {"tools": []},
    }

    @app.post("/mcp")
    async def mcp(request: Request) -> Response:
        """JSON-RPC 2.0: ``initialize``, ``ping``, ``tools/list``."""
        try:
            message = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(None, -32700, "parse error: send one JSON-RPC 2.0 request object")
        if (
            not isinstance(message, dict)
            or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)
        ):
            return _error(None, -32600, 'invalid request: send {"jsonrpc": "2.0", "id": 1, "method": ...}')
        if "id" not in message:  # a notification: nothing to answer
            return Response(status_code=202)
        request_id = message["id"] if isinstance(message["id"], (str, int)) else None
        method = message["method"]
        if method not in results:
            return _error(request_id, -32601, f"method not found; this server answers {', '.join(results)}")
        return JSONResponse({"jsonrpc": "2.0", "id": request_id, "result": results[method]})


def _error(request_id: Any, code: int, message: str) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})
