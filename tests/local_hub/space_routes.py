"""The Hub's Space repository API, as much of it as `spaces/deploy.py` calls through huggingface_hub 2.x (paths,
bodies and replies read from `hf_api.py`'s `create_repo`, `space_info`, `add_space_variable`, `add_space_secret`,
`get_space_variables`, `get_space_secrets`, `get_space_runtime`, `request_space_hardware`, `_validate_yaml`, and
from `_upload_pipeline.py` / `_commit_api.py` for `upload_folder`: preupload, then the commit ndjson).

A Space here is a repository with one branch, `main`: files, commits, variables, secrets, and hardware requests
recorded, nothing built or run. Who may do what is `access.py`'s, the same rules as buckets (`kind="Space"`). Every
preupload answers `regular`, which huggingface_hub accepts for any file: the files then come inline, base64, in the
commit's ndjson, and no LFS or Xet upload happens (the Hub sends binary and large files to Xet; this server does
not, and refuses an `lfsFile` line). Behaviour taken from the client's code is stated as such; the rest is inferred
and marked so.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from . import access
from .context import base_url, hub_of, refuse
from .listing import iso
from .store import Space, SpaceSetting

#: huggingface_hub's `constants.SPACES_SDK_TYPES`.
SDKS = ("gradio", "streamlit", "docker", "static")
#: huggingface_hub's `SpaceHardware` (the Hub's flavors as the client lists them).
HARDWARE = ("cpu-basic", "cpu-upgrade", "zero-a10g", "t4-small", "t4-medium", "l4x1", "l4x4", "l40sx1", "l40sx4",
            "l40sx8", "a10g-small", "a10g-large", "a10g-largex2", "a10g-largex4", "a100-large", "a100x4", "a100x8",
            "rtx-pro-6000", "rtx-pro-6000x2", "rtx-pro-6000x4", "rtx-pro-6000x8")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _space_id(request: Request) -> str:
    return f"{request.path_params['namespace']}/{request.path_params['name']}"


def _caller(request: Request) -> access.Caller:
    return access.caller_from_header(hub_of(request).store, request.headers.get("authorization"))


def _bad(message: str, status: int = 400) -> Response:
    return refuse(access.Refusal(status, None, message))


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except json.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _space_for(request: Request, write: bool) -> tuple[Space | None, Response | None]:
    """The Space of the path, or the refusal: read or write access by `access.py`'s rules."""
    store, space_id = hub_of(request).store, _space_id(request)
    space = store.spaces.get(space_id)
    check = access.check_write if write else access.check_read
    if refusal := check(store, _caller(request), space_id, space, "Space"):
        return None, refuse(refusal)
    return space, None


def _revision_refusal(space: Space, revision: str) -> Response | None:
    """Only `main` (and the head commit's id) exists; another revision answers 404 `RevisionNotFound` (client code:
    that code becomes `RevisionNotFoundError`)."""
    if revision in ("main", space.head):
        return None
    return refuse(access.Refusal(404, "RevisionNotFound", f"Invalid rev id: {revision}"))


def runtime(space: Space) -> dict[str, Any]:
    """`SpaceRuntime`'s fields. Inferred: nothing runs here, so the stage is `NO_APP_FILE` before any file and
    `BUILDING` after; the current hardware is unknown (None); requested is the last request, else `cpu-basic`."""
    last = space.hardware_requests[-1] if space.hardware_requests else {}
    return {
        "stage": "BUILDING" if space.files else "NO_APP_FILE",
        "hardware": {"current": None, "requested": last.get("flavor", "cpu-basic")},
        "gcTimeout": last.get("sleepTimeSeconds"),
        "storage": None,
    }


def _setting_json(setting: SpaceSetting, with_value: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"description": setting.description, "updatedAt": iso(setting.updated_at)}
    if with_value:
        out["value"] = setting.value
    return out


def _set(settings: dict[str, SpaceSetting], body: dict[str, Any]) -> str | None:
    """Add or update one variable or secret from `{"key", "value"[, "description"]}`; the error text if refused
    (inferred: a key must be an environment variable's name, a value a string)."""
    key, value = body.get("key"), body.get("value")
    if not isinstance(key, str) or not _KEY.match(key):
        return f"invalid key {key!r}: letters, digits and underscores, not starting with a digit"
    if not isinstance(value, str):
        return f"the value of {key} must be a string"
    description = body.get("description")
    settings[key] = SpaceSetting(value, description if isinstance(description, str) else None, time.time())
    return None


def _request_hardware(space: Space, caller: access.Caller, body: dict[str, Any]) -> str | None:
    flavor = body.get("flavor")
    if flavor not in HARDWARE:
        return f"unknown hardware flavor {flavor!r}"
    space.hardware_requests.append({"flavor": flavor, "sleepTimeSeconds": body.get("sleepTimeSeconds"),
                                    "user": caller.user, "at": time.time()})
    return None


# --- the repository ------------------------------------------------------------------------------


async def create_repo(request: Request) -> Response:
    """`POST /api/repos/create` with `{"name", "organization", "type": "space", "sdk"[, "visibility", "hardware",
    "sleepTimeSeconds", "secrets", "variables"]}` (client code). `organization` None: the caller's namespace.

    200 `{"url", "name"}` (client code reads `url`); 409 when it exists (client code: `exist_ok=True` passes a 409,
    and on a 401/402/403 asks `repo_info` whether the repo is there). Only `type: "space"` is served (other types:
    400). Inferred: `protected` Spaces are private repositories; the message texts.
    """
    hub = hub_of(request)
    caller = _caller(request)
    body = await _json_body(request)
    if body.get("type") != "space":
        return _bad(f"the local hub serves Space repositories only, not {body.get('type') or 'model'} repositories")
    if refusal := access.check_token(caller) or (
        None if caller.user else access.Refusal(401, None, "You must be authenticated to create a repository")
    ):
        return refuse(refusal)
    name, namespace = body.get("name"), body.get("organization") or caller.user or ""
    if not isinstance(name, str) or not re.match(r"^[\w.-]+$", name):
        return _bad(f"invalid repository name {name!r}")
    if refusal := access.check_create(hub.store, caller, namespace):
        return refuse(refusal)
    space_id = f"{namespace}/{name}"
    url = f"{base_url(request)}/spaces/{space_id}"
    if space_id in hub.store.spaces:
        return JSONResponse({"error": "You already created this space repo", "url": url}, status_code=409,
                            headers={"X-Error-Message": "You already created this space repo"})
    if body.get("sdk") not in SDKS:
        return _bad(f"invalid sdk {body.get('sdk')!r}: one of {', '.join(SDKS)}")
    given_variables: dict[str, SpaceSetting] = {}
    given_secrets: dict[str, SpaceSetting] = {}
    errors = [_set(given_variables, v if isinstance(v, dict) else {}) for v in body.get("variables") or []]
    errors += [_set(given_secrets, s if isinstance(s, dict) else {}) for s in body.get("secrets") or []]
    if body.get("hardware") is not None and body["hardware"] not in HARDWARE:
        errors.append(f"unknown hardware flavor {body['hardware']!r}")
    if error := next((e for e in errors if e), None):
        return _bad(error)
    space = hub.store.create_space(space_id, body["sdk"], private=body.get("visibility") in ("private", "protected"))
    space.variables.update(given_variables)
    space.secrets.update(given_secrets)
    if body.get("hardware") is not None:
        _request_hardware(space, caller, {"flavor": body["hardware"], "sleepTimeSeconds": body.get("sleepTimeSeconds")})
    hub.store.save()
    return JSONResponse({"url": url, "name": space_id, "id": space_id})


async def space_info(request: Request) -> Response:
    """`GET /api/spaces/<ns>/<name>[/revision/<rev>][?blobs=true]`: `SpaceInfo`'s fields (client code), siblings
    with `size` and `blobId` only when `blobs` is asked for, as the Hub does for `files_metadata=True`."""
    space, refusal = _space_for(request, write=False)
    if refusal:
        return refusal
    assert space is not None
    if "revision" in request.path_params and (refusal := _revision_refusal(space, request.path_params["revision"])):
        return refusal
    blobs = request.query_params.get("blobs", "").lower() == "true"
    subdomain = re.sub(r"[/_.]", "-", space.id).lower()
    return JSONResponse({
        "id": space.id,
        "author": space.namespace,
        "sha": space.head,
        "createdAt": iso(space.created_at),
        "lastModified": iso(space.commits[-1].at),
        "private": space.private,
        "disabled": False,
        "gated": False,
        "likes": 0,
        "tags": [],
        "sdk": space.sdk,
        "subdomain": subdomain,
        "host": f"https://{subdomain}.hf.space",
        "siblings": [{"rfilename": path, **({"size": f.size, "blobId": f.oid} if blobs else {})}
                     for path, f in sorted(space.files.items())],
        "runtime": runtime(space),
    })


async def validate_yaml(request: Request) -> Response:
    """`POST /api/validate-yaml` with `{"content", "repoType"}`: `upload_folder` sends the README.md it uploads
    before anything else (client code: 400 with `{"errors": [{"message"}]}` becomes a ValueError, `warnings` are
    warned). Inferred, and far less than the Hub checks: the front matter between `---` lines must parse as a YAML
    mapping, and a Space's `sdk`, when given, must be one of huggingface_hub's SDK types."""
    if refusal := access.check_token(_caller(request)):
        return refuse(refusal)
    body = await _json_body(request)
    content = body.get("content")
    if not isinstance(content, str):
        return JSONResponse({"errors": [{"message": "content must be a string"}], "warnings": []}, status_code=400)
    errors = []
    if content.startswith("---"):
        import yaml

        front, closed, _ = content[3:].partition("\n---")
        try:
            meta = yaml.safe_load(front) if closed else None
        except yaml.YAMLError as error:
            meta, errors = None, [f"the metadata is not valid YAML: {error}"]
        if not closed:
            errors.append("the metadata block is not closed by a '---' line")
        elif meta is not None and not isinstance(meta, dict):
            errors.append("the metadata must be a YAML mapping")
        elif isinstance(meta, dict) and body.get("repoType") == "space" and meta.get("sdk", SDKS[0]) not in SDKS:
            errors.append(f"\"sdk\" must be one of {', '.join(SDKS)}")
    status = 400 if errors else 200
    return JSONResponse({"errors": [{"message": e} for e in errors], "warnings": []}, status_code=status)


# --- variables, secrets, hardware ----------------------------------------------------------------


async def variables(request: Request) -> Response:
    """`GET` (read access) or `POST {"key", "value"[, "description"]}` (write access)
    `/api/spaces/<ns>/<name>/variables`: every variable as `{key: {"value", "description", "updatedAt"}}` (client
    code: `SpaceVariable(k, v)` for each)."""
    space, refusal = _space_for(request, write=request.method == "POST")
    if refusal:
        return refusal
    assert space is not None
    if request.method == "POST":
        if error := _set(space.variables, await _json_body(request)):
            return _bad(error)
        hub_of(request).store.save()
    return JSONResponse({k: _setting_json(v, with_value=True) for k, v in sorted(space.variables.items())})


async def secrets(request: Request) -> Response:
    """`GET` or `POST {"key", "value"[, "description"]}` `/api/spaces/<ns>/<name>/secrets`, both with write access.
    A listing never holds the values (client docstring: "Secret values are write-only and cannot be read back"):
    `{key: {"description", "updatedAt"}}`. Inferred: the POST answers `{}`; listing needs write access."""
    space, refusal = _space_for(request, write=True)
    if refusal:
        return refusal
    assert space is not None
    if request.method == "POST":
        if error := _set(space.secrets, await _json_body(request)):
            return _bad(error)
        hub_of(request).store.save()
        return JSONResponse({})
    return JSONResponse({k: _setting_json(v, with_value=False) for k, v in sorted(space.secrets.items())})


async def hardware(request: Request) -> Response:
    """`POST /api/spaces/<ns>/<name>/hardware` with `{"flavor"[, "sleepTimeSeconds"]}` (client code), write access:
    the request is recorded, the answer is the runtime (`SpaceRuntime`). Inferred: an unknown flavor answers 400;
    billing is not checked (the Hub answers 402 without a payment method: a `status` fault can play that)."""
    space, refusal = _space_for(request, write=True)
    if refusal:
        return refusal
    assert space is not None
    if error := _request_hardware(space, _caller(request), await _json_body(request)):
        return _bad(error)
    hub_of(request).store.save()
    return JSONResponse(runtime(space))


async def get_runtime(request: Request) -> Response:
    """`GET /api/spaces/<ns>/<name>/runtime`, read access."""
    space, refusal = _space_for(request, write=False)
    if refusal:
        return refusal
    assert space is not None
    return JSONResponse(runtime(space))


# --- files ---------------------------------------------------------------------------------------


async def preupload(request: Request) -> Response:
    """`POST /api/spaces/<ns>/<name>/preupload/<rev>` with `{"files": [{"path", "sample", "size"}][, "gitIgnore"]}`
    (client code, 256 files a call), write access. Answers `{"files": [{"path", "uploadMode", "shouldIgnore",
    "oid"}], "commitOid"}`: `uploadMode` always `regular`, `oid` the git blob id of the file already at that path
    (client code: a file whose local git blob id equals it is left out of the commit; when nothing is left, no
    commit is made and it asks `space_info` at `revision/main` instead). Inferred: `gitIgnore` is not applied
    (`shouldIgnore` is always false); `create_pr` is not served (400)."""
    space, refusal = _space_for(request, write=True)
    if refusal:
        return refusal
    assert space is not None
    if refusal := _revision_refusal(space, request.path_params["revision"]):
        return refusal
    if request.query_params.get("create_pr"):
        return _bad("the local hub does not serve pull requests")
    files = (await _json_body(request)).get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in files):
        return _bad("preupload wants {\"files\": [{\"path\", \"sample\", \"size\"}]}")
    answer = []
    for file in files:
        entry: dict[str, Any] = {"path": file["path"], "uploadMode": "regular", "shouldIgnore": False}
        if file["path"] in space.files:
            entry["oid"] = space.files[file["path"]].oid
        answer.append(entry)
    return JSONResponse({"files": answer, "commitOid": space.head})


async def commit(request: Request) -> Response:
    """`POST /api/spaces/<ns>/<name>/commit/<rev>`, an ndjson body (client code, `_prepare_commit_payload`): first
    `{"key": "header", "value": {"summary", "description"[, "parentCommit"]}}`, then one line per operation:
    `{"key": "file", "value": {"content", "path", "encoding": "base64"}}`, `{"key": "deletedFile" | "deletedFolder",
    "value": {"path"}}`, or `{"key": "lfsFile", ...}`, refused here (400): this server never asks for LFS. Answers
    `{"commitUrl", "commitOid"}` (client code). Inferred: the whole commit is refused (400) on the first bad line; a
    `parentCommit` other than the head answers 412; a folder deletion takes the paths under `<path>/`."""
    space, refusal = _space_for(request, write=True)
    if refusal:
        return refusal
    assert space is not None
    if refusal := _revision_refusal(space, request.path_params["revision"]):
        return refusal
    if request.query_params.get("create_pr"):
        return _bad("the local hub does not serve pull requests")
    try:
        lines = [json.loads(line) for line in (await request.body()).splitlines() if line.strip()]
    except json.JSONDecodeError as error:
        return _bad(f"the commit body is not ndjson: {error}")
    if not lines or not isinstance(lines[0], dict) or lines[0].get("key") != "header":
        return _bad("a commit starts with its header line")
    header = lines[0].get("value") or {}
    if header.get("parentCommit") not in (None, space.head):
        return _bad(f"parent commit {header['parentCommit']} is not the head of main ({space.head})", 412)
    added: dict[str, bytes] = {}
    deleted: list[str] = []
    for line in lines[1:]:
        key, value = line.get("key"), line.get("value") or {}
        path = value.get("path")
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            return _bad(f"invalid path {path!r}")
        if key == "file":
            if value.get("encoding") != "base64":
                return _bad(f"{path}: unknown encoding {value.get('encoding')!r}")
            try:
                added[path] = base64.b64decode(value.get("content", ""), validate=True)
            except (binascii.Error, TypeError):
                return _bad(f"{path}: content is not base64")
        elif key in ("deletedFile", "deletedFolder"):
            deleted.append(path.rstrip("/") + "/" if key == "deletedFolder" else path)
        elif key == "lfsFile":
            return _bad(f"{path}: an lfsFile, but the local hub answers every preupload 'regular' and keeps no LFS "
                        "objects")
        else:
            return _bad(f"unknown commit line {key!r}")
    made = hub_of(request).store.commit_space(space, str(header.get("summary", "")),
                                              str(header.get("description", "")), added, deleted)
    return JSONResponse({"commitUrl": f"{base_url(request)}/spaces/{space.id}/commit/{made.oid}",
                         "commitOid": made.oid, "success": True})


_SPACE = "/api/spaces/{namespace}/{name}"

ROUTES = [
    Route("/api/repos/create", create_repo, methods=["POST"], name="api.repo_create"),
    Route("/api/validate-yaml", validate_yaml, methods=["POST"], name="api.validate_yaml"),
    Route(_SPACE, space_info, methods=["GET"], name="api.space_info"),
    Route(_SPACE + "/revision/{revision:path}", space_info, methods=["GET"], name="api.space_info_revision"),
    Route(_SPACE + "/variables", variables, methods=["GET"], name="api.space_variables"),
    Route(_SPACE + "/variables", variables, methods=["POST"], name="api.space_variable_add"),
    Route(_SPACE + "/secrets", secrets, methods=["GET"], name="api.space_secrets"),
    Route(_SPACE + "/secrets", secrets, methods=["POST"], name="api.space_secret_add"),
    Route(_SPACE + "/hardware", hardware, methods=["POST"], name="api.space_hardware"),
    Route(_SPACE + "/runtime", get_runtime, methods=["GET"], name="api.space_runtime"),
    Route(_SPACE + "/preupload/{revision:path}", preupload, methods=["POST"], name="api.space_preupload"),
    Route(_SPACE + "/commit/{revision:path}", commit, methods=["POST"], name="api.space_commit"),
]
