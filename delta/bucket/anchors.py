"""Anchors: full snapshots of a state, as safetensors shard files of bounded size.

Each shard is a plain safetensors file (deterministic bytes, tensors in name order) whose
`__metadata__` holds `format` ("delta-weights-anchor"), `format_version`, `kind` ("anchor"),
`version`, `state_hash` (of the tensors the anchor holds: the whole state, or one rank's part of it
with several trainer ranks), `shard` and `shards`. Tensors
are packed into shards in name order; a shard closes before it would pass the size bound, and a
tensor larger than the bound gets a shard of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from ..errors import DeltaFormatError
from ..format import read_header_json, serialize_safetensors
from ..tensors.state import State

ANCHOR_FORMAT = "delta-weights-anchor"
ANCHOR_FORMAT_VERSION = "1"
DEFAULT_SHARD_BYTES = 512 * 2**20


def shard_names(state: Mapping[str, torch.Tensor], max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> list[list[str]]:
    """Tensor names per shard: name order, each shard at most `max_shard_bytes` unless one tensor is larger."""
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = []
    size = 0
    for name in sorted(state):
        nbytes = state[name].numel() * state[name].element_size()
        if not shards or (size + nbytes > max_shard_bytes and shards[-1]):
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def encode_anchor(
    state: Mapping[str, torch.Tensor], *, version: int, state_hash: str, max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> list[bytes]:
    """Serialise `state` (not modified; GPU tensors are copied to the host) as anchor shard files."""
    groups = shard_names(state, max_shard_bytes)
    return [
        serialize_safetensors(
            {n: state[n] for n in names},
            {
                "format": ANCHOR_FORMAT,
                "format_version": ANCHOR_FORMAT_VERSION,
                "kind": "anchor",
                "version": str(version),
                "state_hash": state_hash,
                "shard": str(i),
                "shards": str(len(groups)),
            },
        )
        for i, names in enumerate(groups)
    ]


def decode_anchor(shards: Sequence[bytes], *, version: int | None = None, paths: Sequence[str] | None = None) -> State:
    """Load anchor shard files into one state (fresh CPU tensors).

    Checks every shard's metadata: the format, that all shards are of one anchor (same version and
    state hash, `version` when given), that each shard index appears once and none is missing.

    Raises:
        DeltaFormatError: a shard is not an anchor file, or the shards do not make one whole anchor.
    """
    state: State = {}
    seen: dict[int, str] = {}
    ident: tuple[str, str, str] | None = None
    for i, data in enumerate(shards):
        path = paths[i] if paths else None
        meta = read_header_json(data, path).get("__metadata__") or {}
        if meta.get("format") != ANCHOR_FORMAT or meta.get("format_version") != ANCHOR_FORMAT_VERSION:
            raise DeltaFormatError(
                f"not a {ANCHOR_FORMAT} v{ANCHOR_FORMAT_VERSION} file "
                f"(format {meta.get('format')!r}, version {meta.get('format_version')!r})",
                path=path,
            )
        this = (meta.get("version", ""), meta.get("state_hash", ""), meta.get("shards", ""))
        if ident is not None and this != ident:
            raise DeltaFormatError(f"shard is of another anchor: {this} vs {ident}", path=path)
        ident = this
        if version is not None and this[0] != str(version):
            raise DeltaFormatError(f"anchor of version {this[0]}, expected {version}", path=path)
        try:
            seen[int(meta["shard"])] = path or str(i)
            tensors = st_load(bytes(data))
        except (KeyError, ValueError, SafetensorError, RuntimeError) as e:
            raise DeltaFormatError(f"bad anchor shard: {e}", path=path) from e
        if state.keys() & tensors.keys():
            raise DeltaFormatError(
                f"tensors appear in two shards: {sorted(state.keys() & tensors.keys())[:5]}", path=path
            )
        state.update(tensors)
    if ident is None or sorted(seen) != list(range(int(ident[2]))):
        raise DeltaFormatError(f"incomplete anchor: shards {sorted(seen)} of {ident[2] if ident else '?'}")
    return state
