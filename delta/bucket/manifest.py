"""The manifest: the JSON file that commits versions to a bucket.

A bucket holds data files under `versions/` and manifests under `manifests/`. Each commit (a publish,
or a `gc` that drops old versions) writes a new manifest `manifests/<commit:010d>.json` that lists
every retained version in full; manifests are never overwritten (some S3 servers show a file being
overwritten as missing for a moment). The newest manifest that parses is the truth: a version exists
once it lists it. Data files live in `versions/<version:08d>-<session>/`, where `session` is random
per publisher run, so a crashed attempt never shares a name with a later one; files that no manifest
references are garbage (`retention`).

Layout of a manifest (keys sorted, one JSON object):

    {"format": "delta-weights-manifest", "format_version": 3, "commit": 12,
     "shards": null | [[tensor names of rank 0], [names of rank 1], ...],
     "pieces": {NAME: {"shape": [16, 64], "dim": 0, "slices": [[PIECE, start, stop], ...]}, ...},  (format_version 2, 3)
     "handovers": [{"old": "ed25519:...", "new": "ed25519:...", "signature": "..."}, ...],  (format_version 3)
     "versions": [{"version": 7, "kind": "anchor" | "delta", "base_version": 6 | null,
                   "base_hash": "sum128:..." | null, "state_hash": "sum128:...",
                   "delta": [FILE, ...], "anchor": [FILE, ...], "published_at": 1764000000.0 | null,
                   "run": "<32 hex>", "signer": "ed25519:...", "signature": "..."}, ...]}   (the last three: format 3)
    FILE = {"path": "versions/00000007-1a2b3c4d/delta-r00000.safetensors", "size": 123,
            "sha256": "<hex>", "rank": 0}

Format 3 (every manifest a `Publisher` writes now) signs each version (`signed_bytes`, `delta.bucket.trust`): `run`
names the publishing run (kept across the trainer's restarts), `signer` is the trainer's public key (a name for the
key to check with, never a reason to trust it), `signature` its Ed25519 signature; `handovers` introduce a trainer's
new key, each signed with the key before it. Readers refuse unsigned versions, so formats 1 and 2 (unsigned) are
followed only when a reader is told to follow a bucket unauthenticated.

`pieces` (only in format_version 2, and only when ranks publish slices of tensors): per sharded tensor,
its full shape, the dimension it is cut along, and its pieces in order; each piece is an ordinary tensor
named PIECE in the files of the one rank whose `shards` list holds it (`delta.pieces`). A manifest whose
pieces do not tile a tensor exactly is refused, so readers stay on the manifest before it. All versions of
a manifest share its `shards` and `pieces`: a publisher that changes them starts a new chain with an anchor.

An anchor version carries its full snapshot (`anchor`, sharded) and, when it has a predecessor, also
the delta from it (`delta`), so readers that follow live never download an anchor.

A manifest is written by whoever can write to the bucket: `Manifest.from_json` reads it strictly (every
field's JSON type and range, `_fields`; state hashes of the form `STATE_HASH`) and checks each version's files
as a whole (`_whole`); what fails is refused in one line, and `read_manifest` falls back to the manifest
before it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import DeltaFormatError, FileTooLargeError, IntegrityError
from ..storage import Storage, StoredFile
from ._fields import array, integer, loads, number, obj, optional_integer, shown, text
from ._whole import check_manifest
from .pieces import Sharded, check_layout

T = TypeVar("T")

MANIFEST_FORMAT = "delta-weights-manifest"
MANIFEST_FORMAT_VERSION = 3  # written when versions are signed; otherwise 2 with `pieces`, else 1 (older readers')
_READABLE_VERSIONS = (1, 2, 3)
MANIFEST_DIR = "manifests/"
VERSIONS_DIR = "versions/"
_MANIFEST_NAME = re.compile(r"manifests/([0-9]{10})\.json")
_VERSION_DIR = re.compile(r"versions/([0-9]{8})-[0-9a-f]+/")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RUN = re.compile(r"[0-9a-f]{32}")
_PUBLIC_KEY = re.compile(r"ed25519:[A-Za-z0-9_-]{43}")
_SIGNATURE = re.compile(r"[A-Za-z0-9_-]{86}")
_KEY_FORM = "'ed25519:' and 43 base64 characters"
#: What a version's signature covers starts with this (`signed_bytes`): a signature made for anything else never
#: passes for a version.
SIGNED_VERSION = b"delta-weights-version/1\n"
#: What a state hash looks like: a scheme (lowercase letters, digits, dashes) and its hex digest, such as
#: ``sum128:<32 hex digits>`` (``xxh3-128:`` in buckets of format 2). The one place the form is defined: readers refuse
#: a manifest whose hashes do not match it, and treat the hashes as opaque strings otherwise.
STATE_HASH = re.compile(r"[a-z0-9-]{1,32}:[0-9a-f]{32,64}")
#: The largest manifest read (a manifest lists every retained version: ~700 bytes per anchor version).
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class FileRef:
    """One data file of a version, with what a reader checks before using it.

    Attributes:
        path: Path in the bucket.
        size: Bytes.
        sha256: Hex SHA-256 of the content.
        rank: The trainer rank whose tensors it holds (0 for a single writer).
    """

    path: str
    size: int
    sha256: str
    rank: int = 0


@dataclass(frozen=True)
class VersionEntry:
    """One committed version.

    Attributes:
        version: Model version, consecutive from 1.
        kind: "anchor" (full snapshot present) or "delta".
        base_version: The version `delta` applies to, or None for the first version.
        base_hash: State hash of `base_version`, or None.
        state_hash: State hash after this version (`delta.state_digest(...).hexdigest`).
        delta: Delta files, one per rank (empty for the first version).
        anchor: Anchor shard files (empty for kind "delta").
        published_at: Unix time at which the trainer handed this state to the publisher, so readers can
            tell how long publishing and following took (None in manifests written without it). Not signed: shown only.
        run: The publishing run's id (32 hex digits), the same across the trainer's restarts on the bucket (None:
            unsigned).
        signer: The public key text of the key that signed it (None: unsigned).
        signature: Its Ed25519 signature of `signed_bytes` (None: unsigned).
    """

    version: int
    kind: str
    base_version: int | None
    base_hash: str | None
    state_hash: str
    delta: tuple[FileRef, ...] = ()
    anchor: tuple[FileRef, ...] = ()
    published_at: float | None = None
    run: str | None = None
    signer: str | None = None
    signature: str | None = None

    @property
    def files(self) -> tuple[FileRef, ...]:
        return self.delta + self.anchor

    @property
    def delta_bytes(self) -> int:
        return sum(f.size for f in self.delta)

    @property
    def anchor_bytes(self) -> int:
        return sum(f.size for f in self.anchor)


@dataclass(frozen=True)
class Handover:
    """A trainer's new key, introduced by its old one (`delta.bucket.trust`).

    Attributes:
        old: The old key's public text.
        new: The new key's public text.
        signature: The old key's signature of `handover_bytes(old, new)`.
    """

    old: str
    new: str
    signature: str

    @classmethod
    def from_json(cls, body: Any) -> Handover:
        """The handover in `body` (parsed JSON: ``{"old", "new", "signature"}``), its fields in their form; the
        signature is not checked here (`delta.bucket.trust`).

        Raises:
            DeltaFormatError: anything else (one line).
        """
        return _handover(body)


@dataclass(frozen=True)
class Manifest:
    """A parsed manifest. Immutable: `with_version` and `retain` return new ones.

    Attributes:
        commit: Commit number; the file is `manifests/<commit:010d>.json`.
        versions: Retained versions, oldest first.
        shards: Tensor names per rank for multi-rank writers, else None.
        pieces: How sharded tensors are cut into the pieces named in `shards` (`delta.pieces`), else None.
        handovers: The trainer's key handovers, oldest first (kept for good: a reader that slept through one needs it).
    """

    commit: int
    versions: tuple[VersionEntry, ...] = ()
    shards: tuple[tuple[str, ...], ...] | None = None
    pieces: dict[str, Sharded] | None = None
    handovers: tuple[Handover, ...] = ()
    _by_version: dict[int, VersionEntry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_version", {v.version: v for v in self.versions})

    @property
    def latest(self) -> VersionEntry | None:
        return self.versions[-1] if self.versions else None

    @property
    def path(self) -> str:
        return manifest_path(self.commit)

    def get(self, version: int) -> VersionEntry | None:
        return self._by_version.get(version)

    def anchors(self) -> list[VersionEntry]:
        return [v for v in self.versions if v.anchor]

    def with_version(
        self,
        entry: VersionEntry,
        shards: tuple[tuple[str, ...], ...] | None = None,
        pieces: dict[str, Sharded] | None = None,
    ) -> Manifest:
        """The next commit, with `entry` appended, under `shards` and `pieces` (the writers' layout).

        A layout other than this manifest's starts a new chain: `entry` must then be an anchor, and the
        versions before it are dropped (their files are garbage), since their deltas are in the old layout.
        """
        if self.latest is not None and entry.version != self.latest.version + 1:
            raise ValueError(f"version {entry.version} does not follow the latest committed {self.latest.version}")
        pieces = pieces or None
        if self.versions and (shards, pieces) != (self.shards, self.pieces):
            if not entry.anchor:
                raise ValueError(f"version {entry.version} changes the ranks' layout but carries no anchor")
            return Manifest(
                self.commit + 1,
                (replace(entry, delta=(), base_version=None, base_hash=None),),
                shards,
                pieces,
                self.handovers,
            )
        return Manifest(self.commit + 1, self.versions + (entry,), shards, pieces, self.handovers)

    def upto(self, version: int) -> Manifest:
        """This manifest without the versions after `version` (same commit number)."""
        return replace(self, versions=tuple(v for v in self.versions if v.version <= version))

    def referenced(self) -> set[str]:
        return {f.path for v in self.versions for f in v.files}

    def to_json(self) -> bytes:
        def file(f: FileRef) -> dict:
            return {"path": f.path, "size": f.size, "sha256": f.sha256, "rank": f.rank}

        def entry(v: VersionEntry) -> dict:
            body = {
                "version": v.version,
                "kind": v.kind,
                "base_version": v.base_version,
                "base_hash": v.base_hash,
                "state_hash": v.state_hash,
                "delta": [file(f) for f in v.delta],
                "anchor": [file(f) for f in v.anchor],
                "published_at": v.published_at,
            }
            if v.signature is not None:
                body.update(run=v.run, signer=v.signer, signature=v.signature)
            return body

        signed = self.handovers or any(v.signature is not None for v in self.versions)
        body = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_FORMAT_VERSION if signed else 2 if self.pieces else 1,
            "commit": self.commit,
            "shards": [list(s) for s in self.shards] if self.shards is not None else None,
            "versions": [entry(v) for v in self.versions],
        }
        if self.pieces:
            body["pieces"] = {name: sharded.to_json() for name, sharded in sorted(self.pieces.items())}
        if signed:
            body["handovers"] = [{"old": h.old, "new": h.new, "signature": h.signature} for h in self.handovers]
        return json.dumps(body, sort_keys=True, indent=1).encode()

    def signed_bytes(self, entry: VersionEntry) -> bytes:
        """What the trainer signs of `entry` (one of this manifest's versions, or the next): `SIGNED_VERSION`, then
        the canonical JSON (keys sorted, no spaces, ASCII) of its number, kind, base version and hash, state hash,
        every file (path, size, SHA-256, rank), run and signer, with the manifest's `shards` and `pieces` (how the
        files' tensors are laid out). Not `published_at` (shown only). The codec and everything else inside a file is
        covered by the file's SHA-256."""
        layout = {name: sharded.to_json() for name, sharded in sorted(self.pieces.items())} if self.pieces else None
        body = {
            "version": entry.version,
            "kind": entry.kind,
            "base_version": entry.base_version,
            "base_hash": entry.base_hash,
            "state_hash": entry.state_hash,
            "run": entry.run,
            "signer": entry.signer,
            "delta": [[f.path, f.size, f.sha256, f.rank] for f in entry.delta],
            "anchor": [[f.path, f.size, f.sha256, f.rank] for f in entry.anchor],
            "shards": [list(s) for s in self.shards] if self.shards is not None else None,
            "pieces": layout,
        }
        return SIGNED_VERSION + json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    @classmethod
    def from_json(cls, data: bytes, path: str | None = None) -> Manifest:
        """Parse and check a manifest: every field's JSON type and range (canonical integers, hashes in
        their pattern), consecutive versions, and each version's files as a whole (`_whole.check_version`).

        Raises:
            DeltaFormatError: not a manifest, an unsupported format version, or malformed fields (one line).
        """
        try:
            return _parse(loads(data, "manifest"))
        except DeltaFormatError as e:
            raise e.at(path) from None


def _parse(body: Any) -> Manifest:
    if type(body) is not dict or body.get("format") != MANIFEST_FORMAT:
        raise DeltaFormatError(f"not a {MANIFEST_FORMAT} file")
    format_version = body.get("format_version")
    if type(format_version) is not int or format_version not in _READABLE_VERSIONS:
        raise DeltaFormatError(
            f"manifest format version {shown(format_version)} is not supported "
            f"(supports {_READABLE_VERSIONS}); upgrade the `delta` package"
        )
    obj(body, "manifest", ("commit", "shards", "versions"))
    shards = None
    if body["shards"] is not None:
        shards = _each(body["shards"], "shards", lambda names: _each(names, "", lambda n: text(n, "", 1024)))
    layout = None
    if body.get("pieces"):
        layout = {
            text(n, "a pieces name", 1024): Sharded.from_json(b, n) for n, b in obj(body["pieces"], "pieces").items()
        }
    world = len(shards) if shards is not None else 1
    versions = _each(body["versions"], "versions", lambda v: _entry(v, world))
    handovers = _each(body.get("handovers", []), "handovers", _handover)
    manifest = Manifest(integer(body["commit"], "commit"), versions, shards, layout, handovers)
    check_layout(manifest.pieces or {}, manifest.shards)
    check_manifest(manifest.shards, manifest.versions)
    return manifest


def _each(items: Any, where: str, parse: Callable[[Any], T]) -> tuple[T, ...]:
    """Each element of the JSON array `items` parsed; an error names the element's place (built only then: a
    manifest of thousands of versions parses without formatting a name per field)."""
    out = []
    for i, item in enumerate(array(items, where or "an element")):
        try:
            out.append(parse(item))
        except DeltaFormatError as e:
            raise DeltaFormatError(f"{where}[{i}]{'.' if e.detail[:1].isalpha() else ''}{e.detail}") from None
    return tuple(out)


def _entry(body: Any, world: int) -> VersionEntry:
    body = obj(body, "", ("version", "kind", "base_version", "base_hash", "state_hash", "delta", "anchor"))
    if body["kind"] not in ("anchor", "delta"):
        raise DeltaFormatError(f"kind must be 'anchor' or 'delta', got {shown(body['kind'])}")
    published = body.get("published_at")
    signed = "signature" in body
    return VersionEntry(
        version=integer(body["version"], "version"),
        kind=body["kind"],
        base_version=optional_integer(body["base_version"], "base_version"),
        base_hash=None if body["base_hash"] is None else state_hash(body["base_hash"], "base_hash"),
        state_hash=state_hash(body["state_hash"], "state_hash"),
        delta=_each(body["delta"], "delta", lambda f: _file(f, world)),
        anchor=_each(body["anchor"], "anchor", lambda f: _file(f, world)),
        published_at=None if published is None else number(published, "published_at"),
        run=_matching(body.get("run"), _RUN, "run", "32 lowercase hex digits") if signed else None,
        signer=_matching(body.get("signer"), _PUBLIC_KEY, "signer", _KEY_FORM) if signed else None,
        signature=_matching(body["signature"], _SIGNATURE, "signature", "86 base64 characters") if signed else None,
    )


def _handover(body: Any) -> Handover:
    body = obj(body, "", ("old", "new", "signature"))
    return Handover(
        _matching(body["old"], _PUBLIC_KEY, "old", _KEY_FORM),
        _matching(body["new"], _PUBLIC_KEY, "new", _KEY_FORM),
        _matching(body["signature"], _SIGNATURE, "signature", "86 base64 characters"),
    )


def _matching(value: Any, pattern: re.Pattern[str], what: str, form: str) -> str:
    if type(value) is not str or not pattern.fullmatch(value):
        raise DeltaFormatError(f"{what} must be {form}, got {shown(value)}")
    return value


def _file(body: Any, world: int) -> FileRef:
    body = obj(body, "", ("path", "size", "sha256"))
    digest = body["sha256"]
    if type(digest) is not str or not _SHA256.fullmatch(digest):
        raise DeltaFormatError(f"sha256 must be 64 lowercase hex digits, got {shown(digest)}")
    return FileRef(
        text(body["path"], "path", 1024),
        integer(body["size"], "size"),
        digest,
        integer(body.get("rank", 0), "rank", 0, world - 1),
    )


def state_hash(value: Any, what: str = "state hash") -> str:
    """`value` if it has the form of a state hash (`STATE_HASH`), else DeltaFormatError."""
    if type(value) is not str or not STATE_HASH.fullmatch(value):
        raise DeltaFormatError(f"{what} must look like 'sum128:<32 hex digits>', got {shown(value)}")
    return value


def manifest_path(commit: int) -> str:
    return f"{MANIFEST_DIR}{commit:010d}.json"


def version_dir(version: int, session: str) -> str:
    """Folder of one publish attempt's data files; `session` is lowercase hex, random per publisher."""
    return f"{VERSIONS_DIR}{version:08d}-{session}/"


def version_of_path(path: str) -> int | None:
    """The version a data file belongs to, from its folder name, or None for another file."""
    m = _VERSION_DIR.match(path)
    return int(m.group(1)) if m else None


def manifest_commits(storage: Storage | list[StoredFile]) -> list[tuple[int, str]]:
    """(commit, path) of every manifest file in the bucket (or among the files of a listing of it), newest first."""
    files = storage if isinstance(storage, list) else storage.list(MANIFEST_DIR)
    return [(commit, f.path) for commit, f in _commits(files)]


def _listed(storage: Storage, max_age: float = 0.0) -> list[tuple[int, StoredFile]]:
    """(commit, listed file) of every manifest file in the bucket, newest first."""
    return _commits(storage.list(MANIFEST_DIR, max_age=max_age))


def _commits(files: list[StoredFile]) -> list[tuple[int, StoredFile]]:
    """(commit, file) of the manifest files among `files`, newest first."""
    found = []
    for f in files:
        m = _MANIFEST_NAME.fullmatch(f.path)
        if m:
            found.append((int(m.group(1)), f))
    return sorted(found, key=lambda found: found[0], reverse=True)


class PolledManifests:
    """What a caller that polls `read_manifest` keeps between polls (pass the same one each time), so that a poll
    that finds nothing new reads nothing: the manifests refused so far, skipped unread until their listing changes,
    and the last manifest read, returned again unread while the listing shows it unchanged (the same path, size and
    etag: on the Hub and S3 the etag names the content; a local folder names none, and its manifest is read again,
    which costs no request).

    Attributes:
        refused: By path: (the listed size it was refused at, why).
    """

    def __init__(self) -> None:
        self.refused: dict[str, tuple[int, DeltaFormatError]] = {}
        self._last: tuple[StoredFile, Manifest] | None = None

    def unchanged(self, listed: StoredFile) -> Manifest | None:
        """The manifest read last, if `listed` is the same file with the same content."""
        if self._last is not None and listed.etag is not None and self._last[0] == listed:
            return self._last[1]
        return None

    def read(self, listed: StoredFile, manifest: Manifest) -> None:
        self._last = (listed, manifest)
        self.refused.pop(listed.path, None)


def read_manifest(
    storage: Storage,
    on_refused: Callable[[DeltaFormatError], None] | None = None,
    polled: PolledManifests | None = None,
    max_age: float = 0.0,
) -> Manifest | None:
    """The newest manifest that reads and parses, or None for a bucket with no version yet.

    A newest manifest that is missing by the time it is read (deleted by gc), does not parse (a torn
    write on a server without atomic PUT), is larger than `MAX_MANIFEST_BYTES` (refused by its listed size
    before it is read, and never read past that bound) or fails a check (crafted) is skipped in favour of
    the one before, and `on_refused` is told why.

    Requests: one listing of `manifests/`, and one read of the manifest returned (none with `polled` when it did not
    change since the last poll), the entry listed passed on (`Storage.read`'s `listed`: no metadata asked again).

    Args:
        polled: Kept by a caller that polls (`PolledManifests`): a poll that finds the newest manifest unchanged reads
            nothing, and one refused is skipped unread, `on_refused` not told again, until its listing changes.
            None: every manifest is read afresh.
        max_age: For a caller that polls: `manifests/` may be listed from the listing of the bucket this process
            made at most `max_age` seconds ago (`Storage.list`).

    Raises:
        BucketUnreachableError, StorageError: from the bucket.
        DeltaFormatError: manifests exist but none parses (the message names the newest).
    """
    listed = _listed(storage, max_age)
    if polled is not None:
        for gone in polled.refused.keys() - {f.path for _, f in listed}:
            del polled.refused[gone]
    first_error: DeltaFormatError | None = None
    for commit, f in listed:
        known = polled.refused.get(f.path) if polled is not None else None
        if known is not None and known[0] == f.size:
            first_error = first_error or known[1]
            continue
        same = polled.unchanged(f) if polled is not None else None
        if same is not None:
            return same
        try:
            manifest = _read_one(storage, commit, f)
        except FileNotFoundError:
            continue
        except DeltaFormatError as e:
            first_error = first_error or e
            if polled is not None:
                polled.refused[f.path] = (f.size, e)
            if on_refused is not None:
                on_refused(e)
            continue
        if polled is not None:
            polled.read(f, manifest)
        return manifest
    if first_error is not None:
        raise first_error
    return None


def manifests_after(storage: Storage, commit: int) -> Iterator[Manifest]:
    """The manifests older than `commit` that read and parse, newest first, each read when asked for (for a
    publisher that looks for its own versions behind a newest manifest that holds none)."""
    for older, listed in _listed(storage):
        if older < commit:
            try:
                yield _read_one(storage, older, listed)
            except (FileNotFoundError, DeltaFormatError):
                continue


def _read_one(storage: Storage, commit: int, listed: StoredFile) -> Manifest:
    path = listed.path
    try:
        if listed.size > MAX_MANIFEST_BYTES:
            raise FileTooLargeError(url=storage.url, path=path, limit=MAX_MANIFEST_BYTES, size=listed.size)
        data = storage.read(path, max_bytes=MAX_MANIFEST_BYTES, listed=listed)
    except FileTooLargeError as e:
        told = f"{e.size:,} bytes" if e.size is not None else "more bytes"
        raise DeltaFormatError(f"{told}, more than the {MAX_MANIFEST_BYTES:,} a manifest may hold", path=path) from e
    manifest = Manifest.from_json(data, path=path)
    if manifest.commit != commit:
        raise DeltaFormatError(f"holds commit {manifest.commit}, its name says {commit} (copied by hand?)", path=path)
    return manifest


def write_manifest(storage: Storage, manifest: Manifest, listed: list[StoredFile] | None = None) -> Manifest:
    """Commit `manifest` and return it as written: renumbered above every manifest file present, parsed
    or torn, so that no file is ever overwritten.

    This one write is the commit: before it the version does not exist, after it it does. It is
    atomic where a single file write is (local directory: rename; S3: one PUT; HF: one batch call).

    Args:
        listed: The bucket's files as the caller listed them just now (one listing for this and `collect_garbage`);
            None: `manifests/` is listed here.
    """
    commits = [c for c, _ in (_commits(listed) if listed is not None else _listed(storage))]
    manifest = replace(manifest, commit=max([manifest.commit, *(c + 1 for c in commits)]))
    storage.write(manifest.path, manifest.to_json())
    return manifest


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def file_ref(path: str, data: bytes, rank: int = 0) -> FileRef:
    return FileRef(path, len(data), sha256(data), rank)


def fetch_verified(storage: Storage, ref: FileRef, listed: StoredFile | None = None) -> bytes:
    """Read a data file and check its size and SHA-256 against the manifest.

    `listed`: its entry in a listing (`Storage.listed`), which saves the backend asking for its metadata; used only
    where its size is the manifest's.

    Raises:
        IntegrityError: size or hash differ (truncated, corrupted or replaced file; one larger than the
            manifest says is not read past its size).
        FileNotFoundError: the file is gone (deleted, or collected by gc after a newer commit).
        BucketUnreachableError, StorageError: from the bucket.
    """
    try:
        data = storage.read(
            ref.path, max_bytes=ref.size, listed=listed if listed is not None and listed.size == ref.size else None
        )
    except FileTooLargeError as e:
        actual = f"{e.size}" if e.size is not None else f"more than {ref.size}"
        raise IntegrityError(f"{ref.path}: wrong size", expected=str(ref.size), actual=actual, path=ref.path) from e
    if len(data) != ref.size:
        raise IntegrityError(f"{ref.path}: wrong size", expected=str(ref.size), actual=str(len(data)), path=ref.path)
    actual = sha256(data)
    if actual != ref.sha256:
        raise IntegrityError(f"{ref.path}: SHA-256 mismatch", expected=ref.sha256, actual=actual, path=ref.path)
    return data
