"""What the local Hub remembers: users and their tokens, buckets and the paths in them, Xet files (a file hash →
the xorb ranges that make it up) and the xorbs' bytes; Space repositories (their files, commits, variables, secrets
and hardware requests) and the files' bytes.

Everything lives under one root folder: `state.json` (rewritten whole, atomically, after every change),
`xorbs/<hash>` (one file per xorb) and `blobs/<git sha1>` (a Space file's bytes, by their git blob id). A server
restarted on the same root finds the same buckets, Spaces, files, users and tokens; upload grants in flight are
forgotten, as a restarted CAS would (the client asks for a new one).

Not thread-safe: the server runs one event loop and every change happens between two awaits.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from .xet_formats import Segment, Shard, XetFormatError, XorbLayout, parse_xorb

Scope = Literal["read", "write"]


@dataclass
class User:
    """A Hub account. `orgs` are the organisations it belongs to (their namespaces it may write)."""

    name: str
    orgs: list[str] = field(default_factory=list)


@dataclass
class Token:
    """A Hub access token (`hf_...`), fine for `scope` and nothing more."""

    value: str
    user: str
    scope: Scope
    revoked: bool = False


@dataclass
class XetToken:
    """A CAS access token handed out by a bucket's xet-read-token / xet-write-token route."""

    value: str
    user: str | None
    scope: Scope
    bucket: str
    exp: int


@dataclass
class BucketFile:
    """A path in a bucket: which Xet file it points to."""

    xet_hash: str
    size: int
    mtime_ms: int
    uploaded_at: float
    content_type: str | None = None


@dataclass
class Bucket:
    """A bucket: its paths, and when they last changed (`updated_at`, the `updatedAt` of its info; its creation
    until a batch changes a path)."""

    id: str
    private: bool
    created_at: float
    files: dict[str, BucketFile] = field(default_factory=dict)
    updated_at: float = 0.0

    def __post_init__(self) -> None:
        self.updated_at = self.updated_at or self.created_at

    @property
    def namespace(self) -> str:
        return self.id.split("/", 1)[0]


@dataclass
class SpaceFile:
    """A file of a Space repository: its git blob id (the name of its bytes under `blobs/`) and size."""

    oid: str
    size: int


@dataclass
class SpaceCommit:
    oid: str
    summary: str
    description: str
    parent: str | None
    at: float


@dataclass
class SpaceSetting:
    """A Space variable or secret (a secret's value is never sent back by the Hub routes)."""

    value: str
    description: str | None
    updated_at: float


@dataclass
class Space:
    """A Space repository on its one branch, `main`: files, commits (oldest first, the first made at creation),
    variables, secrets, and the hardware requested (each request kept, the last one in force)."""

    id: str
    sdk: str
    private: bool
    created_at: float
    files: dict[str, SpaceFile] = field(default_factory=dict)
    commits: list[SpaceCommit] = field(default_factory=list)
    variables: dict[str, SpaceSetting] = field(default_factory=dict)
    secrets: dict[str, SpaceSetting] = field(default_factory=dict)
    hardware_requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.id.split("/", 1)[0]

    @property
    def head(self) -> str:
        return self.commits[-1].oid

    @property
    def requested_hardware(self) -> str | None:
        return self.hardware_requests[-1]["flavor"] if self.hardware_requests else None


def git_blob_id(data: bytes) -> str:
    """Git's id of a blob (`git hash-object`): sha1 of `blob <size>\\0` and the bytes; what huggingface_hub compares a
    local file against to skip unchanged files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class XetFile:
    """A file the CAS knows from a shard: its size and its xorb ranges, in order."""

    size: int
    segments: list[Segment]


@dataclass
class Settings:
    """Knobs the admin API can turn.

    Attributes:
        page_size: Entries per page of a tree listing (the Hub's is larger; keep it small to exercise paging).
        xet_token_lifetime_s: Seconds a CAS token stays valid.
        xorb_grants: Serve xorb uploads through upload grants (hf_xet ≥ 1.8's path); off answers 404 to grant
            requests, which sends hf_xet to `POST /v1/xorbs`.
        cas_v2: Serve `/v2/reconstructions` and `/v2/shards`; off answers them 404, which sends hf_xet to the v1
            routes (its documented fallback).
        quota: Optional real rate limit, `{"window_s": 300, "api": 1000, "resolver": 5000}`: requests per user
            (or per client address when anonymous) and class in each fixed window; `None` for none.
        events_off: Serve no events feed: `GET /api/buckets/<id>/events` answers this status (501: a deployment
            without the feed; 404: one without the route), which huggingface_hub's client takes, both alike, as
            "cannot follow this bucket". None: the feed is served.
        events_replay_s: Seconds of changes the feed keeps to replay (the Hub's buffer: about 15 minutes); a resume
            point older than what is kept answers `reset`. 0 keeps nothing once sent.
        events_ping_s: Seconds between the keep-alive comments of an open stream (the Hub: about 30).
    """

    page_size: int = 1000
    xet_token_lifetime_s: int = 3600
    xorb_grants: bool = True
    cas_v2: bool = True
    quota: dict[str, int] | None = None
    events_off: int | None = None
    events_replay_s: float = 900.0
    events_ping_s: float = 30.0


class StoreError(Exception):
    """A request the store refuses; `status` is the HTTP status the route should answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Store:
    """The local Hub's state, kept under `root` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "xorbs").mkdir(parents=True, exist_ok=True)
        (self.root / "blobs").mkdir(exist_ok=True)
        self.users: dict[str, User] = {}
        self.tokens: dict[str, Token] = {}
        self.xet_tokens: dict[str, XetToken] = {}
        self.buckets: dict[str, Bucket] = {}
        self.spaces: dict[str, Space] = {}
        self.xet_files: dict[str, XetFile] = {}
        self.settings = Settings()
        self._layouts: dict[str, XorbLayout] = {}
        self._load()

    # --- persistence -------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.root / "state.json"

    def _load(self) -> None:
        if not self.state_path.exists():
            return
        state = json.loads(self.state_path.read_text())
        self.users = {k: User(**v) for k, v in state["users"].items()}
        self.tokens = {k: Token(**v) for k, v in state["tokens"].items()}
        self.xet_tokens = {k: XetToken(**v) for k, v in state["xet_tokens"].items()}
        self.buckets = {
            k: Bucket(v["id"], v["private"], v["created_at"], {p: BucketFile(**f) for p, f in v["files"].items()},
                      v.get("updated_at", 0.0))
            for k, v in state["buckets"].items()
        }
        self.xet_files = {
            k: XetFile(v["size"], [Segment(*s) for s in v["segments"]]) for k, v in state["xet_files"].items()
        }
        self.spaces = {k: _space_from_json(v) for k, v in state.get("spaces", {}).items()}
        self.settings = Settings(**state["settings"])

    def reset(self) -> None:
        """Forget every user, token, bucket and Space, and the settings. The CAS keeps what it holds (Xet files, xorbs,
        blobs), as the Hub's does: it is content-addressed, and a client process that uploaded some content once
        (hf_xet remembers it) may point a path at it again without sending it."""
        self.users, self.tokens, self.xet_tokens = {}, {}, {}
        self.buckets, self.spaces = {}, {}
        self.settings = Settings()
        self.save()

    def save(self) -> None:
        """Write `state.json` atomically (a temporary file renamed over it)."""
        now = time.time()
        self.xet_tokens = {k: t for k, t in self.xet_tokens.items() if t.exp > now - 86400}  # keep it small
        state: dict[str, Any] = {
            "users": {k: asdict(v) for k, v in self.users.items()},
            "tokens": {k: asdict(v) for k, v in self.tokens.items()},
            "xet_tokens": {k: asdict(v) for k, v in self.xet_tokens.items()},
            "buckets": {k: asdict(v) for k, v in self.buckets.items()},
            "spaces": {k: asdict(v) for k, v in self.spaces.items()},
            "xet_files": {
                k: {"size": v.size, "segments": [[s.xorb, s.start, s.end, s.unpacked] for s in v.segments]}
                for k, v in self.xet_files.items()
            },
            "settings": asdict(self.settings),
        }
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".state-")
        with os.fdopen(fd, "w") as out:
            json.dump(state, out)
        os.replace(tmp, self.state_path)

    # --- users and tokens --------------------------------------------------------------------------

    def add_user(self, name: str, orgs: list[str] | None = None) -> User:
        """Create or update a user (its orgs replaced when given)."""
        user = self.users.setdefault(name, User(name))
        if orgs is not None:
            user.orgs = sorted(set(orgs))
        self.save()
        return user

    def add_token(self, user: str, scope: Scope, value: str | None = None) -> Token:
        """A new token for `user` (created if missing); `value` defaults to a random `hf_...`."""
        if scope not in ("read", "write"):
            raise StoreError(400, f"token scope must be 'read' or 'write', got {scope!r}")
        self.users.setdefault(user, User(user))
        token = Token(value or "hf_" + secrets.token_urlsafe(24), user, scope)
        self.tokens[token.value] = token
        self.save()
        return token

    def revoke_token(self, value: str) -> None:
        if value not in self.tokens:
            raise StoreError(404, "no such token")
        self.tokens[value].revoked = True
        self.save()

    def namespaces_of(self, user: str) -> set[str]:
        """The namespaces `user` may create buckets in and write to: its own and its orgs'."""
        found = self.users.get(user)
        return {user, *(found.orgs if found else [])}

    def issue_xet_token(self, user: str | None, scope: Scope, bucket: str, lifetime_s: int) -> XetToken:
        token = XetToken("xet_" + secrets.token_urlsafe(24), user, scope, bucket, int(time.time()) + lifetime_s)
        self.xet_tokens[token.value] = token
        self.save()
        return token

    # --- buckets -----------------------------------------------------------------------------------

    def create_bucket(self, bucket_id: str, private: bool) -> Bucket:
        if bucket_id in self.buckets:
            raise StoreError(409, f"bucket {bucket_id} already exists")
        bucket = Bucket(bucket_id, private, time.time())
        self.buckets[bucket_id] = bucket
        self.save()
        return bucket

    def delete_bucket(self, bucket_id: str) -> None:
        self.buckets.pop(bucket_id, None)
        self.save()

    def move_bucket(self, source: str, target: str) -> None:
        if target in self.buckets:
            raise StoreError(409, f"bucket {target} already exists")
        bucket = self.buckets.pop(source)
        bucket.id = target
        self.buckets[target] = bucket
        self.save()

    # --- xorbs and Xet files -----------------------------------------------------------------------

    def _xorb_path(self, xorb: str) -> Path:
        return self.root / "xorbs" / xorb

    def has_xorb(self, xorb: str) -> bool:
        return self._xorb_path(xorb).exists()

    def put_xorb(self, xorb: str, data: bytes) -> bool:
        """Store a xorb's bytes after checking its chunk headers; False if it was already there.

        Raises:
            StoreError: 400 when the bytes are not a xorb.
        """
        try:
            layout = parse_xorb(data)
        except XetFormatError as error:
            raise StoreError(400, f"xorb {xorb}: {error}") from error
        if self.has_xorb(xorb):
            return False
        fd, tmp = tempfile.mkstemp(dir=self.root / "xorbs", prefix=".xorb-")
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, self._xorb_path(xorb))
        self._layouts[xorb] = layout
        return True

    def xorb_layout(self, xorb: str) -> XorbLayout:
        if xorb not in self._layouts:
            self._layouts[xorb] = parse_xorb(self.read_xorb(xorb))
        return self._layouts[xorb]

    def read_xorb(self, xorb: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes `[start, end)` of a stored xorb (to its end when `end` is None)."""
        with open(self._xorb_path(xorb), "rb") as source:
            source.seek(start)
            return source.read(-1 if end is None else max(0, end - start))

    def xorb_size(self, xorb: str) -> int:
        return self._xorb_path(xorb).stat().st_size

    def register_shard(self, shard: Shard) -> list[str]:
        """Record the files a shard describes, after checking every segment against the stored xorbs.

        Returns:
            The file hashes, in shard order.

        Raises:
            StoreError: 400 for a segment naming a xorb that was never uploaded, chunks past its end, or an unpacked
                size that disagrees with the chunk headers.
        """
        for file in shard.files:
            for segment in file.segments:
                if not self.has_xorb(segment.xorb):
                    raise StoreError(400, f"file {file.file_hash}: xorb {segment.xorb} was never uploaded")
                layout = self.xorb_layout(segment.xorb)
                if segment.end > layout.num_chunks:
                    raise StoreError(
                        400, f"file {file.file_hash}: chunks [{segment.start}, {segment.end}) of xorb {segment.xorb} "
                        f"which has {layout.num_chunks}"
                    )
                if sum(layout.unpacked[segment.start : segment.end]) != segment.unpacked:
                    raise StoreError(400, f"file {file.file_hash}: unpacked size of xorb {segment.xorb} disagrees")
        for file in shard.files:
            self.xet_files[file.file_hash] = XetFile(file.size, list(file.segments))
        self.save()
        return [file.file_hash for file in shard.files]

    # --- Space repositories ------------------------------------------------------------------------

    def create_space(self, space_id: str, sdk: str, private: bool) -> Space:
        """A new Space with one empty commit, `initial commit`."""
        if space_id in self.spaces:
            raise StoreError(409, f"space {space_id} already exists")
        space = Space(space_id, sdk, private, time.time())
        self.spaces[space_id] = space
        self.commit_space(space, "initial commit", "", {}, [])
        return space

    def put_blob(self, data: bytes) -> str:
        """Keep a Space file's bytes under their git blob id; returns the id."""
        oid = git_blob_id(data)
        path = self.root / "blobs" / oid
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=self.root / "blobs", prefix=".blob-")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        return oid

    def read_blob(self, oid: str) -> bytes:
        return (self.root / "blobs" / oid).read_bytes()

    def commit_space(self, space: Space, summary: str, description: str, added: dict[str, bytes],
                     deleted: list[str]) -> SpaceCommit:
        """Apply a commit to `space`: `deleted` paths first (a path ending in `/` deletes the folder), then `added`."""
        for path in deleted:
            for existing in [p for p in space.files if p == path or (path.endswith("/") and p.startswith(path))]:
                del space.files[existing]
        for path, data in added.items():
            space.files[path] = SpaceFile(self.put_blob(data), len(data))
        parent = space.commits[-1].oid if space.commits else None
        tree = json.dumps(sorted((p, f.oid) for p, f in space.files.items()))
        oid = hashlib.sha1(f"{parent}\n{summary}\n{description}\n{time.time_ns()}\n{tree}".encode()).hexdigest()
        commit = SpaceCommit(oid, summary, description, parent, time.time())
        space.commits.append(commit)
        self.save()
        return commit


def _space_from_json(data: dict[str, Any]) -> Space:
    return Space(
        data["id"], data["sdk"], data["private"], data["created_at"],
        files={p: SpaceFile(**f) for p, f in data["files"].items()},
        commits=[SpaceCommit(**c) for c in data["commits"]],
        variables={k: SpaceSetting(**v) for k, v in data["variables"].items()},
        secrets={k: SpaceSetting(**v) for k, v in data["secrets"].items()},
        hardware_requests=list(data["hardware_requests"]),
    )
