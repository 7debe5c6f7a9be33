"""The admin API under `/_local_hub/`: what a test (in another process) changes and reads. JSON in, JSON out; no
auth (the server listens on 127.0.0.1 only); never counted.

    GET    /_local_hub/health                         {"ok": true, "pid": ...}
    GET    /_local_hub/state                          users, tokens (masked), buckets and their files, Xet files
                                                      (size, chunks, xorbs), xorbs stored (count, bytes), settings
    POST   /_local_hub/users        {"name", "orgs"}  create or update a user
    POST   /_local_hub/tokens       {"user", "scope": "read"|"write"[, "token"]}  → {"token"}
    DELETE /_local_hub/tokens/<token>                 revoke
    PUT    /_local_hub/buckets/<ns>/<name> {"private"[, "create"]}  set visibility (create if asked)
    PUT    /_local_hub/settings     {"page_size", "xet_token_lifetime_s", "xorb_grants", "cas_v2", "quota",
                                                      "events_off", "events_replay_s", "events_ping_s"}
    GET    /_local_hub/faults                         the rules in force, with their hits
    POST   /_local_hub/faults       {rule}            → the rule with its id (see `faults.py`)
    DELETE /_local_hub/faults[/<id>]                  clear all, or one
    GET    /_local_hub/counts                         by class, route, user, token, and unknown routes
    DELETE /_local_hub/counts                         reset counts (and the request log)
    GET    /_local_hub/requests                       the last requests, oldest first
    DELETE /_local_hub/quota                          forget the quota windows' usage
    POST   /_local_hub/reset        {config}          a fresh Hub on the same process: buckets, Spaces, users and
                                                      tokens dropped, then seeded from `config` (as at a first
                                                      start); settings back to their defaults; faults, counts, quota
                                                      windows, grants and the events feed (its streams end, a new
                                                      epoch of cursors) forgotten; the CAS's content kept
    GET    /_local_hub/files/<ns>/<name>/<path>       a file's bytes as this server decodes them from its xorbs
    GET    /_local_hub/spaces/<ns>/<name>             a Space: sdk, private, variables, secrets with their values,
                                                      hardware requests, files (oid, size), commits
    GET    /_local_hub/spaces/<ns>/<name>/files/<path>  a Space file's bytes
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .context import hub_of
from .hub_routes import file_bytes
from .store import Settings, StoreError


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def health(request: Request) -> Response:
    return JSONResponse({"ok": True, "pid": os.getpid()})


async def state(request: Request) -> Response:
    store = hub_of(request).store
    xorbs = [p for p in (store.root / "xorbs").iterdir() if not p.name.startswith(".")]
    return JSONResponse({
        "users": {name: asdict(user) for name, user in store.users.items()},
        "tokens": [{"token": t.value[:8] + "…", "user": t.user, "scope": t.scope, "revoked": t.revoked}
                   for t in store.tokens.values()],
        "buckets": {
            bucket_id: {"private": b.private,
                        "files": {p: {"size": f.size, "xet_hash": f.xet_hash} for p, f in sorted(b.files.items())}}
            for bucket_id, b in sorted(store.buckets.items())
        },
        "spaces": {space_id: {"sdk": s.sdk, "private": s.private, "head": s.head, "files": len(s.files),
                               "variables": sorted(s.variables), "secrets": sorted(s.secrets),
                               "hardware": s.requested_hardware}
                   for space_id, s in sorted(store.spaces.items())},
        "xet_files": {h: {"size": f.size, "chunks": sum(s.end - s.start for s in f.segments),
                          "xorbs": sorted({s.xorb for s in f.segments})} for h, f in store.xet_files.items()},
        "xorbs": {"count": len(xorbs), "bytes": sum(p.stat().st_size for p in xorbs)},
        "settings": asdict(store.settings),
    })


async def add_user(request: Request) -> Response:
    body: dict[str, Any] = await request.json()
    if not body.get("name"):
        return _error(400, "a user needs a name")
    return JSONResponse(asdict(hub_of(request).store.add_user(body["name"], body.get("orgs"))))


async def add_token(request: Request) -> Response:
    body: dict[str, Any] = await request.json()
    try:
        token = hub_of(request).store.add_token(body["user"], body.get("scope", "write"), body.get("token"))
    except (KeyError, StoreError) as error:
        return _error(getattr(error, "status", 400), f"bad token request: {error}")
    return JSONResponse({"token": token.value, "user": token.user, "scope": token.scope})


async def revoke_token(request: Request) -> Response:
    try:
        hub_of(request).store.revoke_token(request.path_params["token"])
    except StoreError as error:
        return _error(error.status, str(error))
    return JSONResponse({"revoked": True})


async def set_bucket(request: Request) -> Response:
    store = hub_of(request).store
    bucket_id = f"{request.path_params['namespace']}/{request.path_params['name']}"
    body: dict[str, Any] = await request.json()
    bucket = store.buckets.get(bucket_id)
    if bucket is None:
        if not body.get("create"):
            return _error(404, f"no bucket {bucket_id}")
        bucket = store.create_bucket(bucket_id, bool(body.get("private", False)))
    if "private" in body:
        bucket.private = bool(body["private"])
    store.save()
    return JSONResponse({"id": bucket.id, "private": bucket.private})


async def set_settings(request: Request) -> Response:
    store = hub_of(request).store
    body: dict[str, Any] = await request.json()
    unknown = set(body) - set(Settings.__dataclass_fields__)
    if unknown:
        return _error(400, f"unknown settings: {', '.join(sorted(unknown))}")
    for key, value in body.items():
        setattr(store.settings, key, value)
    store.save()
    return JSONResponse(asdict(store.settings))


async def faults(request: Request) -> Response:
    book = hub_of(request).faults
    if request.method == "POST":
        try:
            rule = book.add(await request.json())
        except (TypeError, ValueError) as error:
            return _error(400, str(error))
        hub_of(request).feeds.poke()  # open streams act on a stream fault at once
        return JSONResponse(asdict(rule))
    if request.method == "DELETE":
        if "rule_id" in request.path_params:
            if not book.remove(int(request.path_params["rule_id"])):
                return _error(404, "no such fault rule")
        else:
            book.clear()
    return JSONResponse(book.snapshot())


async def counts(request: Request) -> Response:
    hub = hub_of(request)
    if request.method == "DELETE":
        hub.counts.reset()
    return JSONResponse(hub.counts.snapshot())


async def requests(request: Request) -> Response:
    return JSONResponse(hub_of(request).counts.requests())


async def reset_quota(request: Request) -> Response:
    hub_of(request).quota.reset()
    return JSONResponse({})


async def reset(request: Request) -> Response:
    """A fresh Hub for the next test of a session that shares this server (tests/conftest.py)."""
    from .__main__ import seed

    hub = hub_of(request)
    hub.store.reset()
    seed(hub.store, await request.json(), fresh=True)
    hub.faults.clear()
    hub.counts.reset()
    hub.quota.reset()
    hub.grants.clear()
    hub.feeds.reset()
    return JSONResponse({})


async def decoded_file(request: Request) -> Response:
    store = hub_of(request).store
    bucket = store.buckets.get(f"{request.path_params['namespace']}/{request.path_params['name']}")
    file = bucket.files.get(request.path_params["path"]) if bucket else None
    if file is None:
        return _error(404, "no such file")
    return Response(file_bytes(request, file.xet_hash), media_type="application/octet-stream")


async def space(request: Request) -> Response:
    """A Space as the server holds it, secret values included (the Hub routes never send those back)."""
    store = hub_of(request).store
    found = store.spaces.get(f"{request.path_params['namespace']}/{request.path_params['name']}")
    if found is None:
        return _error(404, "no such space")
    return JSONResponse({
        "id": found.id, "sdk": found.sdk, "private": found.private, "head": found.head,
        "variables": {k: v.value for k, v in sorted(found.variables.items())},
        "secrets": {k: v.value for k, v in sorted(found.secrets.items())},
        "hardware_requests": found.hardware_requests,
        "files": {p: asdict(f) for p, f in sorted(found.files.items())},
        "commits": [asdict(c) for c in found.commits],
    })


async def space_file(request: Request) -> Response:
    store = hub_of(request).store
    found = store.spaces.get(f"{request.path_params['namespace']}/{request.path_params['name']}")
    file = found.files.get(request.path_params["path"]) if found else None
    if file is None:
        return _error(404, "no such file")
    return Response(store.read_blob(file.oid), media_type="application/octet-stream")


_ADMIN = "/_local_hub"

ROUTES = [
    Route(_ADMIN + "/health", health, methods=["GET"], name="admin.health"),
    Route(_ADMIN + "/state", state, methods=["GET"], name="admin.state"),
    Route(_ADMIN + "/users", add_user, methods=["POST"], name="admin.users"),
    Route(_ADMIN + "/tokens", add_token, methods=["POST"], name="admin.tokens"),
    Route(_ADMIN + "/tokens/{token}", revoke_token, methods=["DELETE"], name="admin.token_revoke"),
    Route(_ADMIN + "/buckets/{namespace}/{name}", set_bucket, methods=["PUT"], name="admin.bucket"),
    Route(_ADMIN + "/settings", set_settings, methods=["PUT"], name="admin.settings"),
    Route(_ADMIN + "/faults", faults, methods=["GET", "POST", "DELETE"], name="admin.faults"),
    Route(_ADMIN + "/faults/{rule_id:int}", faults, methods=["DELETE"], name="admin.fault"),
    Route(_ADMIN + "/counts", counts, methods=["GET", "DELETE"], name="admin.counts"),
    Route(_ADMIN + "/requests", requests, methods=["GET"], name="admin.requests"),
    Route(_ADMIN + "/quota", reset_quota, methods=["DELETE"], name="admin.quota"),
    Route(_ADMIN + "/reset", reset, methods=["POST"], name="admin.reset"),
    Route(_ADMIN + "/files/{namespace}/{name}/{path:path}", decoded_file, methods=["GET"], name="admin.file"),
    Route(_ADMIN + "/spaces/{namespace}/{name}", space, methods=["GET"], name="admin.space"),
    Route(_ADMIN + "/spaces/{namespace}/{name}/files/{path:path}", space_file, methods=["GET"],
          name="admin.space_file"),
]
