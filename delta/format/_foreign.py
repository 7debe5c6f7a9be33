"""Delta files written by other software, read into our `raw` layout so they apply like ours.

TRL's AsyncGRPO delta branches (huggingface/trl, `trl/experimental/async_grpo/`) wrote these; none carries our state
hashes (the reader's hash after applying is its own):

- Blog layout: `{name}.indices` (int32 positions) + `{name}.values`, no `format`.
- Earlier `sparse_weight_patch`: the same tensors, metadata `format=sparse_weight_patch`, counts, `changed_params`
  and `checksum_sha256` (of the whole state after applying); an empty step holds `__empty_delta__`; its anchors are
  `format=anchor_checkpoint`.
- Middle `sparse_weight_patch`: the same, `sparse`, no checksum; `sparse=False` marks an anchor.
- Later `sparse_weight_patch`: `{name}.idx` + `{name}.val`, `idx` int32 positions (`encoding=raw`) or uint16/uint32
  gaps (`gap_delta`); nvCOMP bytes (`nvcomp_cascaded`) are refused.

Whatever a layout writes is checked (canonical counts, `changed_params` naming exactly the tensors present, one index
per values tensor of one length, positions strictly increasing, a 64-hex checksum). An anchor applies as whole tensors;
a patch that changes nothing is refused."""

from __future__ import annotations

import hashlib
import re

import numpy as np
import torch

from ..errors import DeltaFormatError, IntegrityError
from ..tensors.bits import DTYPE_NAMES, bits
from .header import FORMAT_NAME, DeltaHeader, TensorEntry, load_tensors, metadata_int, parse_json, shown

PATCH_FORMAT = "sparse_weight_patch"
ANCHOR_FORMAT = "anchor_checkpoint"
EMPTY_PLACEHOLDER = "__empty_delta__"
BLOG_KEYS = frozenset({"num_params", "sparse"})  # the metadata of TRL's first engine (commit a3a382585)
_GAP_DTYPES = (torch.uint16, torch.uint32)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_COUNTS = ("num_changed_params", "total_changed_elements", "total_elements", "anchor_step", "num_params")
_VERSIONS = ("model_version", "prev_model_version")
HASH_CHUNK = 1 << 22


def read(
    meta: dict, names: list[str], data: bytes | memoryview, path: str | None
) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """A file of another format as a foreign `raw` delta: (header, blobs in the `raw` layout).

    Raises:
        DeltaFormatError: not a layout this reader knows, or a malformed one (the message says which).
    """
    fmt = meta.get("format")
    ours = sorted({"base_hash", "target_hash", "format_version", "tensors"} & set(meta))
    if ours:  # a delta of ours with its format changed or removed would otherwise apply without its hashes
        raise DeltaFormatError(
            f"metadata 'format' is {shown(fmt)}, but the file carries {FORMAT_NAME!r} keys "
            f"{ours}: refused rather than read without its hashes",
            path=path,
        )
    if fmt is None and set(meta) - BLOG_KEYS:
        raise DeltaFormatError(
            f"metadata without a 'format' has keys {shown(sorted(meta)[:6], 120)}: not a layout "
            f"this reader knows (TRL's blog layout has at most {sorted(BLOG_KEYS)})",
            path=path,
        )
    suffixes = {n.rsplit(".", 1)[-1] if "." in n else "" for n in names}
    if fmt is None and names and suffixes <= {"indices", "values"}:
        return _patch(meta, names, data, path, "indices")
    if fmt is None and names and meta.get("sparse") == "False":
        return _anchor(meta, data, path, checksum=_checksum(meta, path))
    if fmt == ANCHOR_FORMAT:
        if meta.get("version") != "1":
            raise DeltaFormatError(
                f"anchor_checkpoint version {shown(meta.get('version'))} is not supported (supports '1')", path=path
            )
        return _anchor(meta, data, path, checksum=_checksum(meta, path))
    if fmt != PATCH_FORMAT:
        raise DeltaFormatError(
            f"metadata 'format' is {shown(fmt)}, expected {FORMAT_NAME!r}: not a delta file", path=path
        )
    if meta.get("version") != "1":
        raise DeltaFormatError(
            f"sparse_weight_patch version {shown(meta.get('version'))} is not supported (supports '1')", path=path
        )
    sparse = meta.get("sparse")
    if sparse not in (None, "True", "False"):
        raise DeltaFormatError(f"metadata 'sparse' is {shown(sparse)}, expected 'True' or 'False'", path=path)
    if sparse == "False":
        if suffixes & {"idx", "val", "indices", "values"}:
            raise DeltaFormatError(
                "metadata 'sparse' is 'False' (an anchor: whole tensors), but the tensors are named as a patch's",
                path=path,
            )
        return _anchor(meta, data, path, checksum=_checksum(meta, path))
    if names and suffixes <= {"idx", "val"}:
        return _patch(meta, names, data, path, "idx")
    if names == [EMPTY_PLACEHOLDER] or (names and suffixes <= {"indices", "values"}):
        return _patch(meta, names, data, path, "indices")
    raise DeltaFormatError(
        "a sparse_weight_patch needs `{name}.idx` + `{name}.val` (or `{name}.indices` + "
        f"`{{name}}.values`) for every tensor; this one holds {shown(names[:4], 120)}",
        path=path,
    )


def _checksum(meta: dict, path: str | None) -> str:
    value = meta.get("checksum_sha256", "")
    if value and not _SHA256.fullmatch(value):
        raise DeltaFormatError(f"metadata 'checksum_sha256' is {shown(value)}, not 64 lowercase hex digits", path=path)
    return value


def _numbers(meta: dict, path: str | None) -> tuple[int | None, int | None]:
    """(model_version, prev_model_version), after checking every number TRL writes is in canonical form."""
    for key in _COUNTS:
        if key in meta:
            metadata_int(meta, key, path)
    version, base = (metadata_int(meta, k, path, signed=True) if k in meta else None for k in _VERSIONS)
    return version, base


def _counted(meta: dict, tensors: int, elements: int, path: str | None) -> None:
    """The counts the file writes must be what it holds."""
    for key, held in (("num_changed_params", tensors), ("total_changed_elements", elements)):
        if key in meta and metadata_int(meta, key, path) != held:
            raise DeltaFormatError(f"metadata {key!r} is {meta[key]}, the file holds {held}", path=path)


def _patch(
    meta: dict, names: list[str], data: bytes | memoryview, path: str | None, kind: str
) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """`{name}.idx`/`.val` (kind 'idx') or `{name}.indices`/`.values` (kind 'indices') as our raw layout."""
    version, base = _numbers(meta, path)
    checksum = _checksum(meta, path)
    value_kind = "val" if kind == "idx" else "values"
    prefixes = sorted({n.rsplit(".", 1)[0] for n in names if n != EMPTY_PLACEHOLDER})
    if sorted(names) != sorted(
        [f"{p}.{kind}" for p in prefixes]
        + [f"{p}.{value_kind}" for p in prefixes]
        + ([EMPTY_PLACEHOLDER] if EMPTY_PLACEHOLDER in names else [])
    ):
        missing = sorted({f"{p}.{k}" for p in prefixes for k in (kind, value_kind)} - set(names))
        raise DeltaFormatError(
            f"every tensor needs exactly `{{name}}.{kind}` and `{{name}}.{value_kind}`; missing "
            f"{shown(missing[:3], 120)}",
            path=path,
            tensor=missing[0].rsplit(".", 1)[0] if missing else None,
        )
    if EMPTY_PLACEHOLDER in names and prefixes:
        raise DeltaFormatError(
            f"{EMPTY_PLACEHOLDER} marks a patch without changes, but this one has tensors", path=path
        )
    encoding = meta.get("encoding")
    if kind == "idx":
        if encoding == "nvcomp_cascaded":
            raise DeltaFormatError(
                "indices coded with nvCOMP Cascaded need nvCOMP on a GPU to decode; publish with "
                "encoding 'gap_delta' or 'raw'",
                path=path,
            )
        if encoding not in ("raw", "gap_delta"):
            raise DeltaFormatError(
                f"unknown sparse_weight_patch encoding {shown(encoding)} (expected 'raw' or 'gap_delta')", path=path
            )
    elif encoding is not None and meta.get("format") is not None:
        raise DeltaFormatError(
            f"metadata 'encoding' ({shown(encoding)}) belongs to `.idx`/`.val` patches; this one "
            "stores `.indices`/`.values`",
            path=path,
        )
    if "changed_params" in meta or (meta.get("format") == PATCH_FORMAT and kind == "indices"):
        listed = parse_json(meta.get("changed_params", ""), "metadata 'changed_params'", path)
        if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
            raise DeltaFormatError("metadata 'changed_params' must be a JSON list of tensor names", path=path)
        if len(set(listed)) != len(listed) or sorted(listed) != prefixes:
            raise DeltaFormatError(
                f"metadata 'changed_params' names {shown(sorted(listed)[:3], 100)} "
                f"({len(listed)}), the file holds {shown(prefixes[:3], 100)} ({len(prefixes)})",
                path=path,
            )
    blobs = load_tensors(data, path)
    out: dict[str, torch.Tensor] = {}
    entries = []
    for name in prefixes:
        idx, val = blobs[f"{name}.{kind}"], blobs[f"{name}.{value_kind}"]
        if idx.dim() != 1 or val.dim() != 1 or idx.numel() != val.numel():
            raise DeltaFormatError(
                f"{kind} {tuple(idx.shape)} and {value_kind} {tuple(val.shape)} must be 1-D and of one length",
                path=path,
                tensor=name,
            )
        if kind == "indices" and idx.dtype not in (
            (torch.int32, torch.int64) if meta.get("format") is None else (torch.int32,)
        ):
            raise DeltaFormatError(f"indices are {idx.dtype}, TRL writes int32 positions", path=path, tensor=name)
        if encoding == "raw" and idx.dtype != torch.int32:
            raise DeltaFormatError(f"encoding 'raw' stores int32 positions, not {idx.dtype}", path=path, tensor=name)
        if encoding == "gap_delta":
            if idx.dtype not in _GAP_DTYPES:
                raise DeltaFormatError(
                    f"encoding 'gap_delta' stores uint16 or uint32 gaps, not {idx.dtype}", path=path, tensor=name
                )
            idx = idx.to(torch.int64)
            if idx.numel() and (int(idx.max()) + 1) * idx.numel() > 2**62:
                raise DeltaFormatError("gaps add up beyond any tensor's size", path=path, tensor=name)
            idx = torch.cumsum(idx + 1, 0) - 1
        out[f"{name}.indices"], out[f"{name}.values"] = idx.to(torch.int64), val
        entries.append(
            TensorEntry(
                name=name,
                dtype=DTYPE_NAMES.get(val.dtype, str(val.dtype)),
                shape=(),
                form="indices",
                changed=idx.numel(),
            )
        )
    changed = sum(e.changed for e in entries)
    _counted(meta, len(entries), changed, path)
    if not changed:
        raise DeltaFormatError(
            "this patch changes nothing (TRL writes one for a step where no weight changed): the "
            "state after it is the base itself; nothing to apply, nothing written",
            path=path,
        )
    return _header(entries, version, base, checksum), out


def _anchor(
    meta: dict, data: bytes | memoryview, path: str | None, checksum: str
) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """A TRL anchor (every tensor in full) as whole-tensor changes; its checksum, if it has one, checked here."""
    version, _ = _numbers(meta, path)
    blobs = load_tensors(data, path)
    if not blobs:
        raise DeltaFormatError("this anchor holds no tensors; nothing to apply, nothing written", path=path)
    if checksum:
        actual = _sha256(dict(blobs))
        if actual != checksum:
            raise IntegrityError(
                f"{path + ': ' if path else ''}anchor does not match its checksum_sha256; nothing was written",
                expected=checksum,
                actual=actual,
                path=path,
            )
    _counted(meta, len(blobs), sum(t.numel() for t in blobs.values()), path)
    entries = [
        TensorEntry(
            name=name,
            dtype=DTYPE_NAMES.get(t.dtype, str(t.dtype)),
            shape=tuple(t.shape),
            form="dense",
            changed=t.numel(),
        )
        for name, t in sorted(blobs.items())
    ]
    return _header(entries, version, None, ""), {f"{name}.values": t for name, t in blobs.items()}


def _header(entries: list[TensorEntry], version: int | None, base_version: int | None, checksum: str) -> DeltaHeader:
    changed = sum(e.changed for e in entries)
    return DeltaHeader(
        codec="raw",
        version=version,
        base_version=base_version,
        changed=changed,
        total=0,
        base_hash="",
        target_hash="",
        tensors=tuple(entries),
        foreign=True,
        checksum=checksum,
    )


def _bf16_bytes(flat: np.ndarray, dtype: torch.dtype) -> memoryview:
    """Bytes of a flat bit view as TRL hashes them: the values as bf16."""
    if dtype == torch.bfloat16:
        return np.ascontiguousarray(flat).data.cast("B")
    t = torch.from_numpy(np.ascontiguousarray(flat)).view(dtype).to(torch.bfloat16)
    return t.view(torch.uint8).numpy().data.cast("B")


def _sha256(state: dict[str, torch.Tensor], changes: dict | None = None) -> str:
    """TRL's `compute_bf16_checksum` of `state` (with `changes` written, without writing them): SHA-256 over
    every tensor's bytes as bf16, names sorted, one chunk of a tensor copied at a time."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        change = (changes or {}).get(name)
        flat = bits(t).reshape(-1)
        if change is not None and change.positions is None:
            flat = change.values
            change = None
        bounds = (
            None
            if change is None
            else np.searchsorted(change.positions, np.arange(0, flat.size + HASH_CHUNK, HASH_CHUNK))
        )
        for k, lo in enumerate(range(0, flat.size, HASH_CHUNK)):
            chunk = flat[lo : lo + HASH_CHUNK]
            if bounds is not None and bounds[k] < bounds[k + 1]:
                a, b = bounds[k], bounds[k + 1]
                chunk = chunk.copy()
                assert change is not None and change.positions is not None  # what the bounds were cut from
                chunk[change.positions[a:b] - lo] = change.values[a:b]
            h.update(_bf16_bytes(chunk, t.dtype))
    return h.hexdigest()


def prove_checksum(header: DeltaHeader, changes: list, state: dict[str, torch.Tensor], path: str | None) -> None:
    """Check a TRL `checksum_sha256` on the state as it will be, before anything is written.

    Raises:
        IntegrityError: the state after applying would not match the checksum (nothing written).
    """
    actual = _sha256(state, {c.name: c for c in changes})
    if actual != header.checksum:
        raise IntegrityError(
            f"{path + ': ' if path else ''}version {header.version} would give a state other than "
            "its checksum_sha256 (TRL's hash of the whole bf16 state); nothing was written",
            expected=header.checksum,
            actual=actual,
            path=path,
        )
