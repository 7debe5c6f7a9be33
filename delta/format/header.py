"""A delta file's header: the `__metadata__` of a plain safetensors file, which says what the file is.

Layout (docs/delta.md, "The delta format"): 8-byte little-endian header length, a JSON header, then
tensor bytes. Our header metadata carries the format name and version, the codec, model and base
versions, element counts, base and target state hashes, and a JSON table of the changed tensors.

The header is checked whole before anything is decoded or allocated: its size (bounded by what a
delta for the reader's state can need), its nesting, every field's JSON type, numbers in canonical
decimal form, names unique and sorted. Reading and writing whole files: `file`.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, overload

import numpy as np
import torch
from numba import njit
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from ..codecs import CODECS, TensorEntry
from ..errors import DeltaFormatError
from ..tensors.bits import DTYPES_BY_NAME

FORMAT_NAME = "delta-weights"
FORMAT_VERSION = 3
#: The state hashes a file carries (`delta.state_digest`).
STATE_HASH = re.compile(r"sum128:[0-9a-f]{32}")
# Header limits (docs/delta.md, "Header limits"). Any reader: MAX_HEADER_BYTES. A reader that holds the
# state the delta applies to: HEADER_BYTES plus, per tensor of that state, HEADER_BYTES_PER_TENSOR and
# four times its name escaped as JSON twice (a name appears in stream names, in the table, and in a
# TRL file's `changed_params`): far more than a delta of that state can need, far less than a bomb.
MAX_HEADER_BYTES = 16 * 1024 * 1024
HEADER_BYTES = 64 * 1024
HEADER_BYTES_PER_TENSOR = 1024
MAX_NESTING = 3  # the header: {"name": {"shape": [...]}}; the table: [{"shape": [...]}]
MAX_DIMS = 64
MAX_COUNT = 2**63 - 1  # any count, size or dimension
METADATA_KEYS = (
    "format",
    "format_version",
    "codec",
    "version",
    "base_version",
    "changed",
    "total",
    "base_hash",
    "target_hash",
    "tensors",
)
ENTRY_KEYS = ("name", "dtype", "shape", "form", "changed")
_WHOLE = re.compile(r"0|[1-9][0-9]*")
_SIGNED = re.compile(r"0|-?[1-9][0-9]*")


@dataclass(frozen=True)
class DeltaHeader:
    """Everything the header metadata of a delta file says.

    Attributes:
        codec: Codec name.
        version: Model version this delta produces (None if unknown, e.g. foreign files).
        base_version: Model version it applies to.
        changed: Changed elements in all.
        total: Elements in the whole state.
        base_hash: State hash the delta applies to ('' when unknown).
        target_hash: State hash after applying ('' when unknown).
        tensors: The changed tensors, sorted by name.
        foreign: True for a file written by other software (TRL's layouts): no state hashes; shapes only
            for whole tensors (form `dense`).
        checksum: A foreign file's SHA-256 of the whole state after applying, as TRL computes it
            (`checksum_sha256` of its earlier layout; '' when the file has none).
    """

    codec: str
    version: int | None
    base_version: int | None
    changed: int
    total: int
    base_hash: str
    target_hash: str
    tensors: tuple[TensorEntry, ...] = field(default_factory=tuple)
    foreign: bool = False
    checksum: str = ""

    @property
    def density(self) -> float:
        return self.changed / self.total if self.total else 0.0

    @classmethod
    def merged(cls, headers: Sequence[DeltaHeader]) -> DeltaHeader:
        """One header for a version that several ranks wrote, one delta each: every rank's tensors, sorted by
        name; `changed` and `total` summed (each rank counts its own share); the rest from the first."""
        if len(headers) == 1:
            return headers[0]
        tensors = tuple(sorted((t for h in headers for t in h.tensors), key=lambda t: t.name))
        return replace(
            headers[0], tensors=tensors, changed=sum(h.changed for h in headers), total=sum(h.total for h in headers)
        )


def header_limit(names: Iterable[str]) -> int:
    """The largest header a delta for a state holding `names` may have (see the constants above)."""
    limit = HEADER_BYTES
    for name in names:
        limit += HEADER_BYTES_PER_TENSOR + 4 * len(json.dumps(json.dumps(name)))
        if limit >= MAX_HEADER_BYTES:
            return MAX_HEADER_BYTES
    return limit


def shown(value: object, limit: int = 40) -> str:
    """A value from a file as an error message quotes it: its repr (escaped), cut after `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "...(" + f"{len(text)} characters)"


def json_kind(value: object) -> str:
    """The JSON name of a parsed value's type."""
    if isinstance(value, bool) or value is None:
        return "true/false/null"
    return {dict: "object", list: "list", str: "string", int: "number", float: "number"}.get(type(value), "value")


@njit(nogil=True, cache=True)
def _nesting_within(text, limit):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled: numba types it
    """True when no JSON array or object in `text` (UTF-8 bytes) is nested deeper than `limit`; brackets
    inside strings do not count. Linear, allocates nothing: runs before the parser."""
    depth = 0
    in_string = False
    escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 92:  # backslash
                escaped = True
            elif c == 34:  # quote
                in_string = False
        elif c == 34:
            in_string = True
        elif c == 91 or c == 123:  # [ {
            depth += 1
            if depth > limit:
                return False
        elif c == 93 or c == 125:  # ] }
            depth -= 1
            if depth < 0:  # not JSON: the parser stops here
                return True
    return True


def parse_json(text: bytes | memoryview | str, what: str, path: str | None = None) -> object:
    """Strict JSON: UTF-8, nested at most MAX_NESTING deep, whole numbers only (at most MAX_COUNT in size), no
    NaN or Infinity, no key twice in an object.

    Raises:
        DeltaFormatError: naming `what` and the first thing that breaks a rule.
    """
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else bytes(text)  # lone surrogates: refused
    if not _nesting_within(np.frombuffer(raw, np.uint8), MAX_NESTING):
        raise DeltaFormatError(f"{what} is nested deeper than {MAX_NESTING} levels", path=path)

    def pairs(items: list[tuple[str, object]]) -> dict:
        out = dict(items)
        if len(out) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    raise DeltaFormatError(f"{what} has key {shown(key)} twice", path=path)
                seen.add(key)
        return out

    def whole(digits: str) -> int:
        if len(digits.lstrip("-")) > 19 or abs(int(digits)) > MAX_COUNT:
            raise DeltaFormatError(f"{what} holds the number {shown(digits)}, larger than {MAX_COUNT}", path=path)
        return int(digits)

    def fraction(digits: str) -> None:
        raise DeltaFormatError(f"{what} holds the number {shown(digits)}; only whole numbers are allowed", path=path)

    def constant(name: str) -> None:
        raise DeltaFormatError(f"{what} holds {name}; only whole numbers are allowed", path=path)

    try:
        return json.loads(
            raw.decode("utf-8"), object_pairs_hook=pairs, parse_int=whole, parse_float=fraction, parse_constant=constant
        )
    except UnicodeDecodeError as e:
        raise DeltaFormatError(f"{what} is not UTF-8 ({e.reason} at byte {e.start})", path=path) from e
    except json.JSONDecodeError as e:
        raise DeltaFormatError(f"{what} is not valid JSON ({e.msg} at character {e.pos})", path=path) from e


@overload
def metadata_int(
    meta: dict, key: str, path: str | None = None, *, signed: bool = False, optional: Literal[False] = False
) -> int: ...
@overload
def metadata_int(
    meta: dict, key: str, path: str | None = None, *, signed: bool = False, optional: bool
) -> int | None: ...
def metadata_int(
    meta: dict, key: str, path: str | None = None, *, signed: bool = False, optional: bool = False
) -> int | None:
    """The whole number a metadata string holds, in canonical decimal form only: ASCII digits, no leading
    zeros, no spaces, no '+', a '-' only where `signed`; '' is None where `optional`.

    Raises:
        DeltaFormatError: naming `key`.
    """
    value = meta.get(key)
    if optional and value == "":
        return None
    if (
        not isinstance(value, str)
        or len(value) > 20
        or not (_SIGNED if signed else _WHOLE).fullmatch(value)
        or abs(int(value)) > MAX_COUNT
    ):
        sign = "an optional '-', " if signed else ""
        raise DeltaFormatError(
            f"metadata {key!r} is {shown(value)}, not a whole number in canonical decimal form "
            f"({sign}ASCII digits, no leading zeros, at most {MAX_COUNT}"
            f"{'; or empty' if optional else ''})",
            path=path,
        )
    return int(value)


def read_header_json(data: bytes | memoryview, path: str | None = None, max_bytes: int = MAX_HEADER_BYTES) -> dict:
    """The JSON header of a safetensors buffer, checked before it is parsed: its length (at most
    `max_bytes`, and inside the file) and nesting; then strictly parsed (`parse_json`), and its
    `__metadata__`, when present, an object of strings."""
    if len(data) < 8:
        raise DeltaFormatError(f"file is {len(data)} bytes, too short for a safetensors header", path=path)
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > max_bytes:
        raise DeltaFormatError(
            f"header is {n} bytes; at most {max_bytes} are allowed here (docs/delta.md, 'Header limits')", path=path
        )
    if 8 + n > len(data):
        raise DeltaFormatError(f"header length {n} does not fit the {len(data)}-byte file (truncated?)", path=path)
    header = parse_json(data[8 : 8 + n], "header", path)
    if not isinstance(header, dict):
        raise DeltaFormatError(f"header is a JSON {json_kind(header)}, not an object", path=path)
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict):
        raise DeltaFormatError(f"header '__metadata__' is a JSON {json_kind(meta)}, not an object", path=path)
    for key, value in meta.items():
        if not isinstance(value, str):
            raise DeltaFormatError(f"metadata {shown(key)} is a JSON {json_kind(value)}, not a string", path=path)
    return header


def load_tensors(data: bytes | memoryview, path: str | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors buffer (safetensors checks offsets, sizes, and that they cover the file)."""
    try:
        return st_load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError, KeyError, TypeError, OverflowError) as e:
        raise DeltaFormatError(f"not a valid safetensors file: {shown(str(e), 200)}", path=path) from e


def _table(text: str, form: str, path: str | None) -> tuple[TensorEntry, ...]:
    """The metadata's table of changed tensors, every field checked; names strictly increasing."""
    rows = parse_json(text, "metadata 'tensors'", path)
    if not isinstance(rows, list):
        raise DeltaFormatError(f"metadata 'tensors' is a JSON {json_kind(rows)}, not a list", path=path)
    entries: list[TensorEntry] = []
    for i, row in enumerate(rows):
        where = f"metadata 'tensors' entry {i}"
        if not isinstance(row, dict):
            raise DeltaFormatError(f"{where} is a JSON {json_kind(row)}, not an object", path=path)
        if tuple(sorted(row)) != tuple(sorted(ENTRY_KEYS)):
            raise DeltaFormatError(
                f"{where} has keys {shown(sorted(row), 120)}, expected {sorted(ENTRY_KEYS)}", path=path
            )
        name = row["name"]
        if not isinstance(name, str):
            raise DeltaFormatError(f"{where}: 'name' is a JSON {json_kind(name)}, not a string", path=path)
        for key in ("dtype", "form"):
            if not isinstance(row[key], str):
                raise DeltaFormatError(f"'{key}' is a JSON {json_kind(row[key])}, not a string", path=path, tensor=name)
        if row["dtype"] not in DTYPES_BY_NAME:
            raise DeltaFormatError(f"dtype {shown(row['dtype'])} is not supported", path=path, tensor=name)
        if row["form"] != form:
            raise DeltaFormatError(f"form {shown(row['form'])} is not this codec's ({form!r})", path=path, tensor=name)
        shape = row["shape"]
        if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(type(d) is int and d >= 0 for d in shape):
            raise DeltaFormatError(
                f"shape {shown(shape)} is not a list of at most {MAX_DIMS} whole numbers", path=path, tensor=name
            )
        numel = 1
        for d in shape:
            numel *= d
            if numel > MAX_COUNT:
                raise DeltaFormatError(
                    f"shape {shown(shape)} has more than {MAX_COUNT} elements", path=path, tensor=name
                )
        changed = row["changed"]
        if type(changed) is not int or not 1 <= changed <= numel:
            raise DeltaFormatError(
                f"'changed' is {shown(changed)}, not a whole number in [1, {numel}] (its elements)",
                path=path,
                tensor=name,
            )
        if entries and name <= entries[-1].name:
            what = "twice" if name == entries[-1].name else f"after {shown(entries[-1].name)}"
            raise DeltaFormatError(
                f"listed {what}: the table lists each tensor once, sorted by name", path=path, tensor=name
            )
        entries.append(TensorEntry(name=name, dtype=row["dtype"], shape=tuple(shape), form=form, changed=changed))
    return tuple(entries)


def own_header(meta: dict, path: str | None) -> DeltaHeader:
    """Our metadata, every key checked (docs/delta.md, "The delta format")."""
    found = meta.get("format_version")
    if found != str(FORMAT_VERSION):
        hint = (
            "it was written by an older `delta`: publish an anchor and follow from there"
            if found in ("1", "2")
            else "upgrade the `delta` package"
        )
        raise DeltaFormatError(
            f"format version {shown(found)} is not supported by this reader (supports {FORMAT_VERSION}); {hint}",
            path=path,
        )
    missing = [k for k in METADATA_KEYS if k not in meta]
    extra = sorted(set(meta) - set(METADATA_KEYS))
    if missing or extra:
        raise DeltaFormatError(
            f"metadata {'lacks ' + str(missing) if missing else ''}"
            f"{' and ' if missing and extra else ''}"
            f"{'has keys this format does not define: ' + shown(extra, 120) if extra else ''}",
            path=path,
        )
    codec = CODECS.get(meta["codec"])
    if codec is None:
        raise DeltaFormatError(f"unknown codec {shown(meta['codec'])}; choose one of {sorted(CODECS)}", path=path)
    for key in ("base_hash", "target_hash"):
        if not STATE_HASH.fullmatch(meta[key]):
            raise DeltaFormatError(
                f"metadata {key!r} is {shown(meta[key])}, not 'sum128:' and 32 lowercase hex digits", path=path
            )
    header = DeltaHeader(
        codec=codec.name,
        version=metadata_int(meta, "version", path, signed=True, optional=True),
        base_version=metadata_int(meta, "base_version", path, signed=True, optional=True),
        changed=metadata_int(meta, "changed", path),
        total=metadata_int(meta, "total", path),
        base_hash=meta["base_hash"],
        target_hash=meta["target_hash"],
        tensors=_table(meta["tensors"], codec.form, path),
    )
    changed, numel = sum(t.changed for t in header.tensors), sum(t.numel for t in header.tensors)
    if changed != header.changed:
        raise DeltaFormatError(
            f"tensor table counts {changed} changed elements, the header says {header.changed}", path=path
        )
    if numel > header.total:
        raise DeltaFormatError(
            f"the table's tensors hold {numel} elements, more than the header's total {header.total}", path=path
        )
    return header
