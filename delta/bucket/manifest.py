"""The manifest: the JSON file that commits versions to a bucket (docs/delta.md, "The manifest", has its layout).

Each commit writes a new `manifests/<commit:010d>.json` listing every retained version in full; manifests are never
overwritten, and the newest that parses is the truth. Data files live in `versions/<version:08d>-<session>/`
(`session` random per publisher run); files no manifest references are garbage (`retention`). One format
(`MANIFEST_FORMAT_VERSION`): each version signed (`signed_bytes`), `handovers` introducing a new key; manifests of
the formats before signing are refused with what to do. Whoever can write to the bucket can write a manifest:
`Manifest.from_json` reads it strictly and `newest_manifest` falls back to the one before a refused one."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from ..errors import DeltaFormatError, FileTooLargeError, IntegrityError
from ..signing import MAX_HANDOVERS, PUBLIC_KEY_FORM, SIGNATURE_FORM, Handover
from ..storage import StoredFile
from ._fields import array, integer, loads, number, obj, optional_integer, shown, text
from ._files import Files
from ._whole import check_manifest
from .pieces import Sharded, check_layout

T = TypeVar("T")
logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "delta-weights-manifest"
MANIFEST_FORMAT_VERSION = 3
MANIFEST_DIR = "manifests/"
VERSIONS_DIR = "versions/"
_MANIFEST_NAME = re.compile(r"manifests/([0-9]{10})\.json")
_VERSION_DIR = re.compile(r"versions/([0-9]{8})-[0-9a-f]+/")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RUN = re.compile(r"[0-9a-f]{32}")
_KEY_FORM = "'ed25519:' and 43 base64 characters"
#: What a version's signature covers starts with this (`signed_bytes`): a signature made for anything else never
#: passes for a version.
SIGNED_VERSION = b"delta-weights-version/1\n"
#: What a state hash looks like (`delta.state_digest`): readers refuse a manifest whose hashes do not match it.
STATE_HASH = re.compile(r"sum128:[0-9a-f]{32}")
#: Names a commit tries when something else than a file holds its name, each twice as far on as the one before.
_MAX_SKIPS = 24
#: Bounds on what a manifest lists, so that parsing one costs what the model can need, whatever a writer put in it:
#: ranks of a writer (`shards`), and tensors or their pieces, the most a model has (a 1T-parameter model has tens of
#: thousands); a version's anchor files are at most its tensors (each shard holds one at least).
MAX_RANKS = 1 << 16
MAX_TENSORS = 1 << 20
#: The largest manifest read (a manifest lists every retained version: ~700 bytes per anchor version).
MAX_MANIFEST_BYTES = 256 << 20


@dataclass(frozen=True)
class FileRef:
    """One data file of a version: its path, size, SHA-256 (hex) and the trainer rank whose tensors it holds."""

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
        base_version, base_hash: The version `delta` applies to and its state hash (None for the first version).
        state_hash: State hash after this version (`delta.state_digest(...).hexdigest`).
        delta: Delta files, one per rank (empty for the first version).
        anchor: Anchor shard files (empty for kind "delta").
        published_at: Unix time the trainer handed this state to the publisher (None: not said; not signed).
        run, signer, signature: The run's id (32 hex digits, kept across restarts), the signing key's public text
            and its Ed25519 signature of `signed_bytes` (None: unsigned).
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
class Manifest:
    """A parsed manifest. Immutable: `with_version` and `retain` return new ones.

    Attributes:
        commit: Commit number; the file is `manifests/<commit:010d>.json`.
        versions: Retained versions, oldest first.
        shards: Tensor names per rank for multi-rank writers, else None.
        pieces: How sharded tensors are cut into the pieces named in `shards` (`delta.pieces`), else None.
        handovers: The trainer's key handovers, oldest first (its last `MAX_HANDOVERS`, kept in every commit).
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
        """The next commit, with `entry` appended, under `shards` and `pieces`. Another layout than this manifest's, or
        a number past the latest's next (a trainer numbering past versions not its own), starts a new chain: `entry`
        must be an anchor, and the versions before it are dropped."""
        latest = self.latest
        skips = latest is not None and entry.version != latest.version + 1
        if latest is not None and (entry.version <= latest.version or (skips and not entry.anchor)):
            raise ValueError(
                f"version {entry.version} does not follow the latest committed {latest.version} (a number past the "
                "next starts a new chain, with an anchor)"
            )
        pieces = pieces or None
        if skips or (self.versions and (shards, pieces) != (self.shards, self.pieces)):
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

        body = {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_FORMAT_VERSION,
            "commit": self.commit,
            "shards": [list(s) for s in self.shards] if self.shards is not None else None,
            "versions": [entry(v) for v in self.versions],
            "handovers": [{"old": h.old, "new": h.new, "signature": h.signature} for h in self.handovers],
        }
        if self.pieces:
            body["pieces"] = {name: sharded.to_json() for name, sharded in sorted(self.pieces.items())}
        return json.dumps(body, sort_keys=True, indent=1).encode()

    def signed_bytes(self, entry: VersionEntry) -> bytes:
        """What the trainer signs of `entry`: `SIGNED_VERSION`, then the canonical JSON of its number, kind, base, state
        hash, files, run and signer, with the manifest's `shards` and `pieces`. Not `published_at`; what is inside a
        file is covered by its SHA-256."""
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
        """Parse and check a manifest: every field's type and range, consecutive versions, and each version's files as a
        whole (`_whole.check_version`).

        Raises:
            DeltaFormatError: not a manifest, an unsupported format, or malformed fields (one line).
        """
        try:
            return _parse(loads(data, "manifest"))
        except DeltaFormatError as e:
            raise e.at(path) from None


def _parse(body: Any) -> Manifest:
    if type(body) is not dict or body.get("format") != MANIFEST_FORMAT:
        raise DeltaFormatError(f"not a {MANIFEST_FORMAT} file")
    format_version = body.get("format_version")
    if type(format_version) is int and format_version in (1, 2):
        raise DeltaFormatError(
            f"manifest format version {format_version} is of a delta from before signed versions: a trainer on this "
            f"bucket starts a new run with an anchor (format {MANIFEST_FORMAT_VERSION})"
        )
    if type(format_version) is not int or format_version != MANIFEST_FORMAT_VERSION:
        raise DeltaFormatError(
            f"manifest format version {shown(format_version)} is not supported (supports "
            f"{MANIFEST_FORMAT_VERSION}); upgrade the `delta` package"
        )
    obj(body, "manifest", ("commit", "shards", "versions", "handovers"))
    handovers = _each(body["handovers"], "handovers", Handover.from_json, MAX_HANDOVERS, "key handovers")
    shards = None
    if body["shards"] is not None:
        ranks = _bounded(body["shards"], "shards", MAX_RANKS, "ranks")
        _bound(sum(len(names) for names in ranks if type(names) is list), "shards", MAX_TENSORS, "tensor names")
        shards = _each(ranks, "shards", lambda names: _each(names, "", lambda n: text(n, "", 1024)))
    layout = None
    if body.get("pieces"):
        sharded = obj(body["pieces"], "pieces")
        _bound(len(sharded), "pieces", MAX_TENSORS, "tensors")
        layout = {text(n, "a pieces name", 1024): Sharded.from_json(b, n, MAX_RANKS) for n, b in sharded.items()}
    world = len(shards) if shards is not None else 1
    versions = _each(body["versions"], "versions", lambda v: _entry(v, world))
    manifest = Manifest(integer(body["commit"], "commit"), versions, shards, layout, handovers)
    check_layout(manifest.pieces or {}, manifest.shards)
    check_manifest(manifest.shards, manifest.versions)
    return manifest


def _each(
    items: Any, where: str, parse: Callable[[Any], T], most: int | None = None, what: str = "elements"
) -> tuple[T, ...]:
    """Each element of the JSON array `items` parsed, at most `most` of them (refused before any is parsed); an
    error names the element's place (built only then: a manifest of thousands of versions parses without formatting
    a name per field)."""
    out = []
    listed = array(items, where or "an element") if most is None else _bounded(items, where, most, what)
    for i, item in enumerate(listed):
        try:
            out.append(parse(item))
        except DeltaFormatError as e:
            raise DeltaFormatError(f"{where}[{i}]{'.' if e.detail[:1].isalpha() else ''}{e.detail}") from None
    return tuple(out)


def _bounded(items: Any, where: str, most: int, what: str) -> list:
    """`items` if it is a JSON array of at most `most` elements."""
    listed = array(items, where or "an element")
    _bound(len(listed), where, most, what)
    return listed


def _bound(count: int, where: str, most: int, what: str) -> None:
    if count > most:
        raise DeltaFormatError(f"{where}: {count:,} {what}, more than the {most:,} a manifest may hold")


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
        delta=_each(body["delta"], "delta", lambda f: _file(f, world), world, "delta files (one per rank)"),
        anchor=_each(body["anchor"], "anchor", lambda f: _file(f, world), MAX_TENSORS, "anchor files"),
        published_at=None if published is None else number(published, "published_at"),
        run=_matching(body.get("run"), _RUN, "run", "32 lowercase hex digits") if signed else None,
        signer=_matching(body.get("signer"), PUBLIC_KEY_FORM, "signer", _KEY_FORM) if signed else None,
        signature=_matching(body["signature"], SIGNATURE_FORM, "signature", "86 base64 characters") if signed else None,
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


def manifest_commits(files: Files | list[StoredFile]) -> list[tuple[int, str]]:
    """(commit, path) of every manifest file in the bucket (or among the files of a listing of it), newest first."""
    listed = files if isinstance(files, list) else files.list(MANIFEST_DIR)
    return [(commit, f.path) for commit, f in _commits(listed)]


def _commits(files: list[StoredFile]) -> list[tuple[int, StoredFile]]:
    """(commit, file) of the manifest files among `files`, newest first."""
    found = []
    for f in files:
        m = _MANIFEST_NAME.fullmatch(f.path)
        if m:
            found.append((int(m.group(1)), f))
    return sorted(found, key=lambda found: found[0], reverse=True)


def newest_manifest(
    files: Files, on_refused: Callable[[DeltaFormatError], None] | None = None, max_age: float = 0.0
) -> Manifest | None:
    """The newest manifest that reads and parses, or None for a bucket with no version yet. One gone (gc), torn, larger
    than `MAX_MANIFEST_BYTES` (refused unread) or failing a check is skipped for the one before, and `on_refused`
    is told why.

    Requests: one listing of `manifests/` (the shared listing, at most `max_age` old) and one read of the manifest
    returned; none while the listing shows it unchanged (`Bucket.parsed`).

    Raises:
        BucketUnreachableError, StorageError: from the bucket.
        DeltaFormatError: manifests exist but none parses (the message names the newest).
    """
    first_error: DeltaFormatError | None = None
    for commit, f in _commits(files.list(MANIFEST_DIR, max_age=max_age)):
        try:
            return files.parsed(f, functools.partial(_read_one, files, commit, f), (DeltaFormatError,))
        except FileNotFoundError:
            continue
        except DeltaFormatError as e:
            first_error = first_error or e
            if on_refused is not None:
                on_refused(e)
    if first_error is not None:
        raise first_error
    return None


def manifests_after(files: Files, commit: int) -> Iterator[Manifest]:
    """The manifests older than `commit` that read and parse, newest first, each read when asked for (for a
    publisher that looks for its own versions behind a newest manifest that holds none)."""
    for older, listed in _commits(files.list(MANIFEST_DIR)):
        if older < commit:
            try:
                yield _read_one(files, older, listed)
            except (FileNotFoundError, DeltaFormatError):
                continue


def _read_one(files: Files, commit: int, listed: StoredFile) -> Manifest:
    path = listed.path
    try:
        if listed.size > MAX_MANIFEST_BYTES:
            raise FileTooLargeError(url=files.url, path=path, limit=MAX_MANIFEST_BYTES, size=listed.size)
        data = files.read(path, max_bytes=MAX_MANIFEST_BYTES, listed=listed)
    except FileTooLargeError as e:
        told = f"{e.size:,} bytes" if e.size is not None else "more bytes"
        raise DeltaFormatError(f"{told}, more than the {MAX_MANIFEST_BYTES:,} a manifest may hold", path=path) from e
    manifest = Manifest.from_json(data, path=path)
    if manifest.commit != commit:
        raise DeltaFormatError(f"holds commit {manifest.commit}, its name says {commit} (copied by hand?)", path=path)
    return manifest


def write_manifest(files: Files, manifest: Manifest, listed: list[StoredFile] | None = None) -> Manifest:
    """Commit `manifest` and return it as written, renumbered above every manifest file present (so that none is
    overwritten). This one write, atomic where a single file write is, is the commit. `listed`: the bucket's files
    as the caller listed them just now (None: `manifests/` is listed here). A name that something else than a file
    holds (a folder planted there, `FileExistsError`) is skipped, said in one line: the commit goes further on.

    Raises:
        FileExistsError: `_MAX_SKIPS` names in a row held (the message says what to remove).
        BucketUnreachableError, StorageError: from the bucket.
    """
    commits = [c for c, _ in _commits(listed if listed is not None else files.list(MANIFEST_DIR))]
    manifest = replace(manifest, commit=max([manifest.commit, *(c + 1 for c in commits)]))
    for skip in range(_MAX_SKIPS):
        try:
            files.write(manifest.path, manifest.to_json())
            return manifest
        except FileExistsError as e:  # a folder planted at the name (a folder bucket): never a reason to stop
            taken = manifest.commit
            manifest = replace(manifest, commit=taken + (1 << skip))
            logger.warning("commit %d skipped (%s): committing as %d", taken, e, manifest.commit)
    raise FileExistsError(
        f"{files.url}: {_MAX_SKIPS} manifest names in a row are held by something else than a file, up to "
        f"{manifest.path}: remove what is in the way in {MANIFEST_DIR}"
    )


def sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def file_ref(path: str, data: bytes, rank: int = 0) -> FileRef:
    return FileRef(path, len(data), sha256(data), rank)


def fetch_verified(files: Files, ref: FileRef, listed: StoredFile | None = None) -> bytes:
    """Read a data file and check its size and SHA-256 against the manifest (`listed`: its entry in a listing, which
    saves asking for its metadata).

    Raises:
        IntegrityError: size or hash differ (a larger file is not read past its size).
        FileNotFoundError: the file is gone.
        BucketUnreachableError, StorageError: from the bucket.
    """
    try:
        data = files.read(
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
