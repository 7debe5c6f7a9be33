"""The Hub's bucket API, as huggingface_hub 2.x calls it (paths, bodies and replies read from `hf_api.py`,
`_buckets.py` and `utils/_xet.py`).

Route names start with the rate-limit class they count under: `api.*` for `/api/...`, `resolver.*` for
`/buckets/<id>/resolve/<path>`. Who may do what, and the error headers, are `access.py`'s. Behaviour taken from the
client's code is stated as such; the rest is inferred and marked so.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import access
from .chunk_codec import decode_chunks
from .context import base_url, hub_of, refuse
from .events import file_change
from .listing import bucket_info, file_entry, page_after, tree_entries
from .store import BucketFile, StoreError

_NOT_SERVED_REPO_TYPES = ("model", "dataset", "space")


def _bucket_id(request: Request) -> str:
    return f"{request.path_params['namespace']}/{request.path_params['name']}"


# --- account -------------------------------------------------------------------------------------


async def whoami(request: Request) -> Response:
    """`GET /api/whoami-v2`: the token's user, its orgs and the token's role (shape of the Hub's answer, trimmed)."""
    hub = hub_of(request)
    caller = access.caller_from_header(hub.store, request.headers.get("authorization"))
    if caller.user is None:
        return refuse(access.Refusal(401, None, access.INVALID_CREDENTIALS))
    orgs = hub.store.users[caller.user].orgs
    return JSONResponse({
        "type": "user",
        "name": caller.user,
        "orgs": [{"type": "org", "name": org} for org in orgs],
        "auth": {"type": "access_token", "accessToken": {"displayName": "local-hub", "role": caller.scope}},
    })


# --- buckets -------------------------------------------------------------------------------------


async def create_bucket(request: Request) -> Response:
    """`POST /api/buckets/<ns>/<name>` with `{"visibility": "public"|"private"}`; `ns` may be `me`.

    200 `{"url": ...}`; 409 with the `url` too (client code: `create_bucket(exist_ok=True)` reads it after a 409).
    Default visibility public (client docstring: "public unless the organization's default is private").
    """
    hub = hub_of(request)
    caller = access.caller_from_header(hub.store, request.headers.get("authorization"))
    namespace = request.path_params["namespace"]
    if namespace == "me":
        if refusal := access.check_token(caller) or (
            None if caller.user else access.Refusal(401, None, "You must be authenticated to create a bucket")
        ):
            return refuse(refusal)
        namespace = caller.user or ""
    bucket_id = f"{namespace}/{request.path_params['name']}"
    url = f"{base_url(request)}/buckets/{bucket_id}"
    if refusal := access.check_create(hub.store, caller, namespace):
        return refuse(refusal)
    if bucket_id in hub.store.buckets:
        return JSONResponse({"error": "You already created this bucket", "url": url}, status_code=409,
                            headers={"X-Error-Message": "You already created this bucket"})
    body = await _json_body(request)
    hub.store.create_bucket(bucket_id, private=body.get("visibility") == "private")
    return JSONResponse({"url": url, "id": bucket_id, "name": request.path_params["name"]})


async def get_bucket(request: Request) -> Response:
    """`GET /api/buckets/<ns>/<name>`: `BucketInfo`'s fields."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    if refusal := access.check_read(hub.store, _caller(request), bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    return JSONResponse(bucket_info(bucket))


async def list_buckets(request: Request) -> Response:
    """`GET /api/buckets/<ns>` (`me` for the caller's): the buckets the caller may see, one page."""
    hub = hub_of(request)
    caller = _caller(request)
    if refusal := access.check_token(caller):
        return refuse(refusal)
    namespace = request.path_params["namespace"]
    if namespace == "me":
        namespace = caller.user or ""
    search = request.query_params.get("search", "")
    found = [
        bucket_info(b) for b in sorted(hub.store.buckets.values(), key=lambda b: b.id)
        if b.namespace == namespace and search in b.id.split("/", 1)[1]
        and access.check_read(hub.store, caller, b.id, b) is None
    ]
    return JSONResponse(found)


async def delete_bucket(request: Request) -> Response:
    """`DELETE /api/buckets/<ns>/<name>`; a missing bucket answers 404 `RepoNotFound` (`delete_bucket(missing_ok=True)`
    swallows exactly a 404: client code)."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    if refusal := access.check_write(hub.store, _caller(request), bucket_id, hub.store.buckets.get(bucket_id)):
        return refuse(refusal)
    hub.store.delete_bucket(bucket_id)
    hub.feeds.end(bucket_id)
    return JSONResponse({})


async def update_settings(request: Request) -> Response:
    """`PUT /api/buckets/<ns>/<name>/settings` with `{"private": bool}`."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    if refusal := access.check_write(hub.store, _caller(request), bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    body = await _json_body(request)
    if "private" in body:
        bucket.private = bool(body["private"])
        hub.store.save()
    return JSONResponse({})


async def move_repo(request: Request) -> Response:
    """`POST /api/repos/move` with `{"fromRepo", "toRepo", "type": "bucket"}`; other repo types are not served."""
    hub = hub_of(request)
    body = await _json_body(request)
    if body.get("type") != "bucket":
        return refuse(access.Refusal(400, None, "the local hub moves buckets only"))
    source, target = str(body.get("fromRepo", "")), str(body.get("toRepo", ""))
    caller = _caller(request)
    if refusal := access.check_write(hub.store, caller, source, hub.store.buckets.get(source)) or (
        access.check_create(hub.store, caller, target.split("/", 1)[0])
    ):
        return refuse(refusal)
    try:
        hub.store.move_bucket(source, target)
    except StoreError as error:
        return refuse(access.Refusal(error.status, None, str(error)))
    hub.feeds.end(source)
    return JSONResponse({})


# --- files ---------------------------------------------------------------------------------------


async def tree(request: Request) -> Response:
    """`GET /api/buckets/<ns>/<name>/tree[/<prefix>]?recursive=...`, paged through a `Link: <...>; rel="next"` header
    (client code: `utils/_pagination.py` follows `next` links that already hold the query)."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    if refusal := access.check_read(hub.store, _caller(request), bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    prefix = request.path_params.get("prefix", "")
    recursive = request.query_params.get("recursive", "false").lower() == "true"
    entries = tree_entries(bucket, prefix, recursive)
    page, cursor = page_after(entries, request.query_params.get("cursor"), hub.store.settings.page_size)
    headers = {}
    if cursor is not None:
        query = urlencode({"recursive": str(recursive).lower(), "cursor": cursor})
        path = request.scope.get("raw_path", request.url.path.encode()).decode("latin-1")  # the prefix as sent
        headers["Link"] = f'<{base_url(request)}{path}?{query}>; rel="next"'
    return JSONResponse(page, headers=headers)


async def paths_info(request: Request) -> Response:
    """`POST /api/buckets/<ns>/<name>/paths-info` with `{"paths": [...]}`: the files among them; missing paths are
    left out (client docstring: "If a path does not exist, it is ignored")."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    if refusal := access.check_read(hub.store, _caller(request), bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    body = await _json_body(request)
    paths = body.get("paths") or []
    return JSONResponse([file_entry(p, bucket.files[p]) for p in paths if p in bucket.files])


async def batch(request: Request) -> Response:
    """`POST /api/buckets/<ns>/<name>/batch`, an ndjson body of `addFile` / `copyFile` / `deleteFile` operations.

    Client code: each line is `{"type": "addFile", "path", "xetHash", "mtime"[, "contentType"]}`,
    `{"type": "copyFile", "path", "xetHash", "mtime", "sourceRepoType", "sourceRepoId"}` or
    `{"type": "deleteFile", "path"}`; failed operations come back as `{"failed": [{"path", "error"}]}` in a 200
    (partial failure) or a 422 (all failed). Inferred: an added hash must be a file the CAS has from a shard; a copy
    needs read access to the source bucket and the hash among its files; deleting a missing path is no failure;
    operations apply in order, each on its own (not a transaction). What they changed is one batch of the bucket's
    events feed (`events.py`).
    """
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    caller = _caller(request)
    if refusal := access.check_write(hub.store, caller, bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    try:
        operations = [json.loads(line) for line in (await request.body()).splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        return refuse(access.Refusal(400, None, f"the batch body is not ndjson: {error}"))
    hub.log.info("batch %s: %s", bucket_id, " ".join(f"{o.get('type')}:{o.get('path')}" for o in operations)[:2000])
    failures, changes = [], []
    for operation in operations:
        path = str(operation.get("path", ""))
        rule = hub.faults.take_batch_entry(
            request.scope.get("local_hub.route", ""), "api", request.method, request.url.path, path
        )
        before = bucket.files.get(path)
        error = (rule.message or "injected failure") if rule else _apply(request, caller, bucket, operation)
        if error:
            failures.append({"path": path, "error": error})
        elif (change := file_change(path, before, bucket.files.get(path))) is not None:
            changes.append(change)
    if changes:  # one event per call that changed something (events.py)
        hub.feeds.publish(bucket, changes, time.time(), hub.store.settings.events_replay_s)
    hub.store.save()
    status = 422 if operations and len(failures) == len(operations) else 200
    return JSONResponse({"failed": failures}, status_code=status)


def _apply(request: Request, caller: access.Caller, bucket: Any, operation: dict[str, Any]) -> str | None:
    """Carry out one batch operation on `bucket`; the error text when it fails."""
    store = hub_of(request).store
    kind, path = operation.get("type"), operation.get("path")
    if not isinstance(path, str) or not path or path.startswith("/"):
        return f"invalid path {path!r}"
    if kind == "deleteFile":
        bucket.files.pop(path, None)
        return None
    xet_hash = operation.get("xetHash")
    if kind == "copyFile":
        source_type, source_id = operation.get("sourceRepoType"), str(operation.get("sourceRepoId", ""))
        if source_type in _NOT_SERVED_REPO_TYPES:
            return f"copying from a {source_type} repository is not served by the local hub"
        source = store.buckets.get(source_id)
        if access.check_read(store, caller, source_id, source) is not None or source is None:
            return f"source bucket {source_id} not found"
        if not any(f.xet_hash == xet_hash for f in source.files.values()):
            return f"xet hash {xet_hash} not found in bucket {source_id}"
    elif kind != "addFile":
        return f"unknown operation type {kind!r}"
    xet_file = store.xet_files.get(str(xet_hash))
    if xet_file is None:
        return f"xet hash {xet_hash} not found in Xet storage"
    mtime = operation.get("mtime")
    bucket.files[path] = BucketFile(
        xet_hash=str(xet_hash),
        size=xet_file.size,
        mtime_ms=int(mtime) if isinstance(mtime, (int, float)) else int(time.time() * 1000),
        uploaded_at=time.time(),
        content_type=operation.get("contentType"),
    )
    return None


# --- Xet tokens and resolve ----------------------------------------------------------------------


async def xet_token(request: Request) -> Response:
    """`GET /api/buckets/<ns>/<name>/xet-{read,write}-token` (client code: `xet_connection_info_refresh_url`, no
    revision for buckets). The answer carries the token both ways the clients read it: JSON `accessToken`, `exp`,
    `casUrl` (hf_xet's `CasJWTInfo`) and headers `X-Xet-Access-Token`, `X-Xet-Token-Expiration`, `X-Xet-Cas-Url`
    (huggingface_hub's `parse_xet_connection_info_from_headers`). The CAS is this same server."""
    hub, bucket_id = hub_of(request), _bucket_id(request)
    scope = "write" if request.url.path.endswith("xet-write-token") else "read"
    caller = _caller(request)
    check = access.check_write if scope == "write" else access.check_read
    if refusal := check(hub.store, caller, bucket_id, hub.store.buckets.get(bucket_id)):
        return refuse(refusal)
    lifetime = hub.store.settings.xet_token_lifetime_s
    route = request.scope.get("local_hub.route", "")
    if hub.faults.take(("expired_token",), route, "api", request.method, request.url.path):
        lifetime = -120  # already expired, beyond the clients' 30 s / 60 s refresh margins
    token = hub.store.issue_xet_token(caller.user, scope, bucket_id, lifetime)
    cas_url = base_url(request)
    return JSONResponse(
        {"accessToken": token.value, "exp": token.exp, "casUrl": cas_url},
        headers={"X-Xet-Access-Token": token.value, "X-Xet-Token-Expiration": str(token.exp), "X-Xet-Cas-Url": cas_url},
    )


async def resolve(request: Request) -> Response:
    """`HEAD|GET /buckets/<ns>/<name>/resolve/<path>`.

    Client code (`get_bucket_file_metadata`): the size from `X-Linked-Size` (else Content-Length), the hash from
    `X-Xet-Hash`, the token route from `Link: <...>; rel="xet-auth"`. A missing path answers 404 `EntryNotFound`.
    The Hub redirects to a CDN; this serves the bytes itself (reconstructed here from the stored xorbs) with
    `Range` support, so a plain GET works too.
    """
    hub, bucket_id = hub_of(request), _bucket_id(request)
    bucket = hub.store.buckets.get(bucket_id)
    if refusal := access.check_read(hub.store, _caller(request), bucket_id, bucket):
        return refuse(refusal)
    assert bucket is not None
    path = request.path_params["path"]
    file = bucket.files.get(path)
    if file is None:
        return refuse(access.Refusal(404, "EntryNotFound", f"{path} does not exist in bucket {bucket_id}"))
    headers = {
        "ETag": f'"{file.xet_hash}"',
        "X-Xet-Hash": file.xet_hash,
        "X-Linked-Size": str(file.size),
        "X-Linked-Etag": f'"{file.xet_hash}"',
        "Link": f'<{base_url(request)}/api/buckets/{bucket_id}/xet-read-token>; rel="xet-auth"',
        "Accept-Ranges": "bytes",
        "Content-Type": file.content_type or "application/octet-stream",
    }
    if request.method == "HEAD":
        return Response(b"", headers={**headers, "Content-Length": str(file.size)})
    data = file_bytes(request, file.xet_hash)
    try:
        start, end = _byte_range(request.headers.get("range"), len(data))
    except ValueError:
        start, end = len(data), len(data)  # an unreadable range: not satisfiable
    if start is None:
        return Response(data, headers=headers)
    if start >= len(data):
        return Response(b"", status_code=416, headers={"Content-Range": f"bytes */{len(data)}"})
    return Response(data[start:end], status_code=206,
                    headers={**headers, "Content-Range": f"bytes {start}-{end - 1}/{len(data)}"})


def file_bytes(request: Request, xet_hash: str) -> bytes:
    """A Xet file's content, decoded from its xorbs by this server."""
    store = hub_of(request).store
    xet_file = store.xet_files[xet_hash]
    parts = []
    for segment in xet_file.segments:
        layout = store.xorb_layout(segment.xorb)
        xorb = store.read_xorb(segment.xorb, 0, layout.offsets[-1])
        parts.append(decode_chunks(xorb, layout, segment.start, segment.end))
    return b"".join(parts)


def _byte_range(header: str | None, size: int) -> tuple[int | None, int]:
    """`bytes=a-b` (inclusive), `bytes=a-` or `bytes=-n` as `[start, end)`; `(None, size)` without a header.

    Raises:
        ValueError: The numbers do not parse.
    """
    if not header or not header.startswith("bytes="):
        return None, size
    first, _, last = header[len("bytes="):].split(",")[0].partition("-")
    if not first:
        return max(0, size - int(last)), size
    return int(first), min(size, int(last) + 1) if last else size


# --- helpers -------------------------------------------------------------------------------------


def _caller(request: Request) -> access.Caller:
    return access.caller_from_header(hub_of(request).store, request.headers.get("authorization"))


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


_BUCKET = "/api/buckets/{namespace}/{name}"

ROUTES = [
    Route("/api/whoami-v2", whoami, methods=["GET"], name="api.whoami"),
    Route("/api/repos/move", move_repo, methods=["POST"], name="api.repo_move"),
    Route("/api/buckets/{namespace}", list_buckets, methods=["GET"], name="api.bucket_list"),
    Route(_BUCKET, create_bucket, methods=["POST"], name="api.bucket_create"),
    Route(_BUCKET, get_bucket, methods=["GET"], name="api.bucket_info"),
    Route(_BUCKET, delete_bucket, methods=["DELETE"], name="api.bucket_delete"),
    Route(_BUCKET + "/settings", update_settings, methods=["PUT"], name="api.bucket_settings"),
    Route(_BUCKET + "/tree", tree, methods=["GET"], name="api.tree"),
    Route(_BUCKET + "/tree/{prefix:path}", tree, methods=["GET"], name="api.tree_prefix"),
    Route(_BUCKET + "/paths-info", paths_info, methods=["POST"], name="api.paths_info"),
    Route(_BUCKET + "/batch", batch, methods=["POST"], name="api.batch"),
    Route(_BUCKET + "/xet-read-token", xet_token, methods=["GET"], name="api.xet_read_token"),
    Route(_BUCKET + "/xet-write-token", xet_token, methods=["GET"], name="api.xet_write_token"),
    Route("/buckets/{namespace}/{name}/resolve/{path:path}", resolve, methods=["GET", "HEAD"], name="resolver.resolve"),
]
