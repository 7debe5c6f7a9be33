"""Xet's CAS, as hf_xet 1.8 talks to it: xorb uploads (through upload grants, or directly), shard uploads (v1 JSON and
v2 ndjson progress), the global dedup query, reconstructions (v1 and v2) and the storage URLs they point to.

Sources: xet-core's `xet_client/src/cas_client/remote_client.rs` and `cas_types/` (routes, bodies, retry rules),
its own local server (`simulation/local_server/handlers.rs`: the replies), xet-core's spec (`spec/api.md`), and
for what postdates the mirror read here (upload grants, new in hf_xet 1.8) xet-core's `xet_client` README and
api_changes note plus the field names compiled into hf_xet. What hf_xet really sends is in the server log.

Every `/v1/` and `/v2/` route wants `Authorization: Bearer <xet token>` from a bucket's token route: no or unknown
token → 401, an expired one → 401, a read token on an upload route → 403. The storage URLs (`/xet-storage/...`,
the stand-ins for S3's presigned URLs) take no token: like presigned URLs, knowing them is the permission; unlike
them they are not signed and do not expire. A CAS token is not tied to the bucket it was issued for (the real CAS
scopes reads to the repo; inferred, not reproduced). There is no global dedup: every chunk query answers 404.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .context import base_url, hub_of
from .store import StoreError, XetToken
from .xet_formats import XetFormatError, is_hash_hex, parse_shard

_GRANT_LIFETIME_S = 900


def authorize(request: Request, scope: str) -> XetToken | Response:
    """The request's CAS token if it allows `scope`, else the error answer."""
    hub = hub_of(request)
    header = request.headers.get("authorization", "")
    token = hub.store.xet_tokens.get(header.removeprefix("Bearer ").strip()) if header.startswith("Bearer ") else None
    if token is None:
        return PlainTextResponse("missing or unknown CAS token", status_code=401)
    if token.exp <= time.time() or request.scope.get("local_hub.expired_token"):
        return PlainTextResponse("CAS token expired", status_code=401)
    if scope == "write" and token.scope != "write":
        return PlainTextResponse("this CAS token is read-only", status_code=403)
    return token


def _hash_param(request: Request, name: str = "hash") -> str | None:
    value = request.path_params[name]
    return value.lower() if is_hash_hex(value) else None


# --- uploads -------------------------------------------------------------------------------------


async def xorb_grant(request: Request) -> Response:
    """`POST /v1/xorb-grants/<prefix>/<hash>` with `{"length", "checksum": {"algo": "crc64nvme", "value"}}`.

    201 with a grant `{"id", "method", "url", "headers"}`; 200 when the xorb is already stored (nothing to upload);
    404 while grants are switched off (`Settings.xorb_grants`), which sends hf_xet to `POST /v1/xorbs`. The CRC is
    recorded, not checked; the length is checked on upload.
    """
    if isinstance(token := authorize(request, "write"), Response):
        return token
    hub, xorb = hub_of(request), _hash_param(request)
    if xorb is None:
        return PlainTextResponse("bad xorb hash", status_code=400)
    if not hub.store.settings.xorb_grants:
        return PlainTextResponse("upload grants are off", status_code=404)
    if hub.store.has_xorb(xorb):
        return JSONResponse({"was_inserted": False}, status_code=200)
    body = json.loads(await request.body() or b"{}")
    grant_id = secrets.token_hex(12)
    hub.grants[grant_id] = {"xorb": xorb, "length": int(body.get("length", -1)), "checksum": body.get("checksum"),
                            "expires": time.time() + _GRANT_LIFETIME_S, "data": None}
    return JSONResponse(
        {"id": grant_id, "method": "PUT", "url": f"{base_url(request)}/xet-storage/uploads/{grant_id}", "headers": {}},
        status_code=201,
    )


async def grant_upload(request: Request) -> Response:
    """`PUT /xet-storage/uploads/<grant id>`: the grant's URL, no CAS token (a presigned URL's stand-in).
    403 for an unknown or expired grant, 412 when this grant already received its bytes, 400 on a length mismatch."""
    hub = hub_of(request)
    grant = hub.grants.get(request.path_params["grant_id"])
    if grant is None or grant["expires"] < time.time():
        return PlainTextResponse("unknown or expired upload grant", status_code=403)
    data = await request.body()
    if grant["data"] is not None:
        return PlainTextResponse("already uploaded", status_code=412)
    if grant["length"] >= 0 and len(data) != grant["length"]:
        return PlainTextResponse(f"expected {grant['length']} bytes, got {len(data)}", status_code=400)
    grant["data"] = data
    return Response(b"", status_code=200)


async def xorb_commit(request: Request) -> Response:
    """`POST /v1/xorb-commits/<prefix>/<hash>/grant/<grant id>`: store the uploaded bytes as the xorb.
    404 when nothing was uploaded for the grant (hf_xet then asks for a new one); 400 when they are not a xorb."""
    if isinstance(token := authorize(request, "write"), Response):
        return token
    hub, xorb = hub_of(request), _hash_param(request)
    grant = hub.grants.get(request.path_params["grant_id"])
    if grant is None or grant["xorb"] != xorb or grant["data"] is None:
        return PlainTextResponse("no data uploaded for this grant", status_code=404)
    return _store_xorb(request, xorb, grant.pop("data"))


async def xorb_upload(request: Request) -> Response:
    """`POST /v1/xorbs/<prefix>/<hash>` with the serialized xorb: the direct upload (hf_xet's fallback)."""
    if isinstance(token := authorize(request, "write"), Response):
        return token
    xorb = _hash_param(request)
    if xorb is None:
        return PlainTextResponse("bad xorb hash", status_code=400)
    return _store_xorb(request, xorb, await request.body())


def _store_xorb(request: Request, xorb: str, data: bytes) -> Response:
    try:
        inserted = hub_of(request).store.put_xorb(xorb, data)
    except StoreError as error:
        return PlainTextResponse(str(error), status_code=error.status)
    return JSONResponse({"was_inserted": inserted})


async def xorb_head(request: Request) -> Response:
    """`HEAD /v1/xorbs/<prefix>/<hash>`: 200 if stored, else 404."""
    if isinstance(token := authorize(request, "read"), Response):
        return token
    xorb = _hash_param(request)
    found = xorb is not None and hub_of(request).store.has_xorb(xorb)
    return Response(b"", status_code=200 if found else 404)


async def shard_upload(request: Request) -> Response:
    """`POST /v1/shards` (JSON `{"result": 1}`) or `/v2/shards` (ndjson progress frames ending in `result`): record
    the files the shard describes. A bad shard is a 400 before any frame is sent."""
    if isinstance(token := authorize(request, "write"), Response):
        return token
    if request.url.path.startswith("/v2/") and not hub_of(request).store.settings.cas_v2:
        return PlainTextResponse("v2 shard uploads are off", status_code=404)
    try:
        hub_of(request).store.register_shard(parse_shard(await request.body()))
    except XetFormatError as error:
        return PlainTextResponse(f"bad shard: {error}", status_code=400)
    except StoreError as error:
        return PlainTextResponse(str(error), status_code=error.status)
    if request.url.path.startswith("/v1/"):
        return JSONResponse({"result": 1})
    frames = [
        {"type": "validating", "verified": 0, "total": 1},
        {"type": "validating", "verified": 1, "total": 1},
        {"type": "committing", "stage": "uploading"},
        {"type": "committing", "stage": "syncing"},
        {"type": "result"},
    ]
    body = "".join(json.dumps(frame) + "\n" for frame in frames)
    return Response(body, media_type="application/x-ndjson")


async def dedup_query(request: Request) -> Response:
    """`GET /v1/chunks/<prefix>/<hash>`: no global dedup here, always 404 (what the CAS says for an unknown chunk)."""
    if isinstance(token := authorize(request, "read"), Response):
        return token
    return PlainTextResponse("chunk not tracked by global deduplication", status_code=404)


async def telemetry(request: Request) -> Response:
    """`POST /v1/telemetry`: hf_xet's transfer summaries, accepted and dropped."""
    await request.body()
    return Response(b"", status_code=200)


# --- downloads -----------------------------------------------------------------------------------


async def reconstruction(request: Request) -> Response:
    """`GET /v1/reconstructions/<file>` or `/v2/...`, with an optional `Range: bytes=a-b` (inclusive) over the file.

    The answer lists terms (xorb, chunk range, unpacked length) covering the range, where the first term starts
    (`offset_into_first_range`), and per xorb the storage URL plus the byte range of those chunks in the xorb
    (v1 `fetch_info` with `url_range`; v2 `xorbs` with one range per entry, so hf_xet fetches each with a single
    `Range`). 404 for an unknown file, 416 for a range starting at or past its end.
    """
    if isinstance(token := authorize(request, "read"), Response):
        return token
    hub, file_hash = hub_of(request), _hash_param(request, "file_hash")
    if request.url.path.startswith("/v2/") and not hub.store.settings.cas_v2:
        return PlainTextResponse("v2 reconstructions are off", status_code=404)
    xet_file = hub.store.xet_files.get(file_hash or "")
    if xet_file is None:
        return PlainTextResponse("file not found", status_code=404)
    start, end = 0, xet_file.size
    header = request.headers.get("range")
    if header:
        first, _, last = header.removeprefix("bytes=").partition("-")
        try:
            start, end = int(first), min(xet_file.size, int(last) + 1 if last else xet_file.size)
        except ValueError:
            return PlainTextResponse(f"bad range {header!r}", status_code=400)
        if start >= xet_file.size or end <= start:
            return PlainTextResponse("range not satisfiable", status_code=416)
    terms, fetch, offset = _plan(request, xet_file.segments, start, end)
    if request.url.path.startswith("/v1/"):
        return JSONResponse({"offset_into_first_range": offset, "terms": terms, "fetch_info": fetch})
    xorbs = {
        xorb: [{"url": f["url"], "ranges": [{"chunks": f["range"], "bytes": f["url_range"]}]} for f in entries]
        for xorb, entries in fetch.items()
    }
    return JSONResponse({"offset_into_first_range": offset, "terms": terms, "xorbs": xorbs})


def _plan(request: Request, segments: list[Any], start: int, end: int) -> tuple[list[Any], dict[str, Any], int]:
    """Terms and fetch info for file bytes `[start, end)`: whole chunks, trimmed by `offset_into_first_range`."""
    store = hub_of(request).store
    terms: list[dict[str, Any]] = []
    fetch: dict[str, list[dict[str, Any]]] = {}
    position, first_chunk_at = 0, None
    for segment in segments:
        layout = store.xorb_layout(segment.xorb)
        chosen = []
        for index in range(segment.start, segment.end):
            size = layout.unpacked[index]
            if position + size > start and position < end:
                chosen.append(index)
                first_chunk_at = position if first_chunk_at is None else first_chunk_at
            position += size
        if not chosen:
            continue
        a, b = chosen[0], chosen[-1] + 1
        terms.append({"hash": segment.xorb, "unpacked_length": sum(layout.unpacked[a:b]),
                      "range": {"start": a, "end": b}})
        entry = {"range": {"start": a, "end": b}, "url": f"{base_url(request)}/xet-storage/xorbs/{segment.xorb}",
                 "url_range": {"start": layout.offsets[a], "end": layout.offsets[b] - 1}}
        if entry not in fetch.setdefault(segment.xorb, []):
            fetch[segment.xorb].append(entry)
    return terms, fetch, start - (first_chunk_at or 0)


async def batch_reconstruction(request: Request) -> Response:
    """`GET /v1/reconstructions?file_id=...&file_id=...`: `{"files": {hash: terms}, "fetch_info": {...}}`."""
    if isinstance(token := authorize(request, "read"), Response):
        return token
    store = hub_of(request).store
    files: dict[str, Any] = {}
    fetch: dict[str, list[Any]] = {}
    for file_hash in request.query_params.getlist("file_id"):
        xet_file = store.xet_files.get(file_hash.lower())
        if xet_file is None:
            return PlainTextResponse(f"file {file_hash} not found", status_code=404)
        terms, file_fetch, _ = _plan(request, xet_file.segments, 0, xet_file.size)
        files[file_hash.lower()] = terms
        for xorb, entries in file_fetch.items():
            fetch.setdefault(xorb, []).extend(e for e in entries if e not in fetch.get(xorb, []))
    return JSONResponse({"files": files, "fetch_info": fetch})


async def file_head(request: Request) -> Response:
    """`HEAD /v1/files/<file>`: the file's size as Content-Length, or 404."""
    if isinstance(token := authorize(request, "read"), Response):
        return token
    xet_file = hub_of(request).store.xet_files.get(_hash_param(request, "file_hash") or "")
    if xet_file is None:
        return Response(b"", status_code=404)
    return Response(b"", headers={"Content-Length": str(xet_file.size)})


async def xorb_bytes(request: Request) -> Response:
    """`GET /xet-storage/xorbs/<hash>` with `Range: bytes=a-b[,c-d...]`: the stored xorb's raw bytes (206), several
    ranges as `multipart/byteranges`; no token (a presigned URL's stand-in)."""
    store, xorb = hub_of(request).store, _hash_param(request)
    if xorb is None or not store.has_xorb(xorb):
        return PlainTextResponse("no such xorb", status_code=404)
    total = store.xorb_size(xorb)
    header = request.headers.get("range")
    if not header:
        return Response(store.read_xorb(xorb))
    ranges = []
    for part in header.removeprefix("bytes=").split(","):
        first, _, last = part.strip().partition("-")
        try:
            a, b = int(first), min(total - 1, int(last)) if last else total - 1
        except ValueError:
            return PlainTextResponse(f"bad range {header!r}", status_code=400)
        if a > b:
            return Response(b"", status_code=416, headers={"Content-Range": f"bytes */{total}"})
        ranges.append((a, b))
    if len(ranges) == 1:
        a, b = ranges[0]
        return Response(store.read_xorb(xorb, a, b + 1), status_code=206,
                        headers={"Content-Range": f"bytes {a}-{b}/{total}"})
    boundary = "local_hub_boundary"
    body = b"".join(
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Range: bytes {a}-{b}/{total}\r\n\r\n".encode()
        + store.read_xorb(xorb, a, b + 1) + b"\r\n"
        for a, b in ranges
    ) + f"--{boundary}--\r\n".encode()
    return Response(body, status_code=206, media_type=f"multipart/byteranges; boundary={boundary}")


ROUTES = [
    Route("/v1/xorb-grants/{prefix}/{hash}", xorb_grant, methods=["POST"], name="cas.xorb_grant"),
    Route("/xet-storage/uploads/{grant_id}", grant_upload, methods=["PUT"], name="cas.grant_upload"),
    Route("/v1/xorb-commits/{prefix}/{hash}/grant/{grant_id}", xorb_commit, methods=["POST"], name="cas.xorb_commit"),
    Route("/v1/xorbs/{prefix}/{hash}", xorb_upload, methods=["POST"], name="cas.xorb_upload"),
    Route("/v1/xorbs/{prefix}/{hash}", xorb_head, methods=["HEAD"], name="cas.xorb_head"),
    Route("/v1/shards", shard_upload, methods=["POST"], name="cas.shard_upload_v1"),
    Route("/v2/shards", shard_upload, methods=["POST"], name="cas.shard_upload_v2"),
    Route("/v1/chunks/{prefix}/{hash}", dedup_query, methods=["GET"], name="cas.dedup_query"),
    Route("/v1/telemetry", telemetry, methods=["POST"], name="cas.telemetry"),
    Route("/v1/reconstructions", batch_reconstruction, methods=["GET"], name="cas.reconstructions_batch"),
    Route("/v1/reconstructions/{file_hash}", reconstruction, methods=["GET"], name="cas.reconstruction_v1"),
    Route("/v2/reconstructions/{file_hash}", reconstruction, methods=["GET"], name="cas.reconstruction_v2"),
    Route("/v1/files/{file_hash}", file_head, methods=["HEAD"], name="cas.file_head"),
    Route("/xet-storage/xorbs/{hash}", xorb_bytes, methods=["GET"], name="cas.xorb_bytes"),
]
