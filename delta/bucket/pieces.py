"""Sharded tensors: each rank publishes slices of tensors as it holds them, readers put them back together.

A slice (an FSDP2 `DTensor`'s local shard, or `split`'s share of a whole model) travels in the rank's files as an
ordinary tensor under a piece name (`NAME@DIM:START`); the manifest's `pieces` table says, per full tensor, its
shape, the dimension it is cut along and which piece holds which range. Readers check that the pieces tile every
tensor exactly (`check_layout`) and assemble it bit for bit (`assemble`, or in place through `piece_views`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import DeltaFormatError
from ..tensors._sumhash import TensorKey
from ..tensors.bits import DTYPE_NAMES
from ._fields import array, integer, obj, shown, text

#: Tensors with fewer elements are not cut by `split` (one rank takes each whole).
MIN_SPLIT_NUMEL = 1 << 16

__all__ = ["Sharded", "Slice", "check_layout", "flatten", "split"]


@dataclass(frozen=True)
class Slice:
    """Indices `start .. start + tensor.shape[dim]` along `dim` of a full tensor of `shape`, as a rank publishes
    them."""

    tensor: torch.Tensor
    shape: tuple[int, ...]
    dim: int
    start: int

    @property
    def stop(self) -> int:
        return self.start + self.tensor.shape[self.dim]


@dataclass(frozen=True)
class Sharded:
    """How one full tensor of `shape` is cut along `dim`: (piece name, start, stop) of each piece, in order."""

    shape: tuple[int, ...]
    dim: int
    pieces: tuple[tuple[str, int, int], ...]

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dim": self.dim, "slices": [list(p) for p in self.pieces]}

    @classmethod
    def from_json(cls, body: Any, name: str, max_slices: int | None = None) -> Sharded:
        """Parse one entry of a manifest's `pieces` (strict types; tiling is `check_layout`'s), of at most
        `max_slices` slices (one per rank: refused before any is parsed).

        Raises:
            DeltaFormatError: a field of the wrong JSON type or out of range.
        """
        what = f"pieces[{shown(name)}]"
        body = obj(body, what, ("shape", "dim", "slices"))
        shape = tuple(integer(n, f"{what}.shape[{i}]") for i, n in enumerate(array(body["shape"], f"{what}.shape")))
        slices = array(body["slices"], f"{what}.slices")
        if max_slices is not None and len(slices) > max_slices:
            raise DeltaFormatError(
                f"{what}.slices: {len(slices):,} slices, more than the {max_slices:,} of one per rank"
            )
        pieces = []
        for i, entry in enumerate(slices):
            entry = array(entry, f"{what}.slices[{i}]")
            if len(entry) != 3:
                raise DeltaFormatError(f"{what}.slices[{i}] must be [piece, start, stop], got {shown(entry)}")
            pieces.append(
                (
                    text(entry[0], f"{what}.slices[{i}] piece", 1024),
                    integer(entry[1], f"{what}.slices[{i}] start"),
                    integer(entry[2], f"{what}.slices[{i}] stop"),
                )
            )
        return cls(shape, integer(body["dim"], f"{what}.dim", 0, max(len(shape) - 1, 0)), tuple(pieces))


#: Full tensor name -> how it is cut.
Layout = dict[str, Sharded]
#: Piece name -> (full name, full shape, dim, start, stop): what one rank's slices are.
PieceRecord = dict[str, tuple[str, tuple[int, ...], int, int, int]]


def piece_name(name: str, dim: int, start: int) -> str:
    """The name a slice travels under in the files."""
    return f"{name}@{dim}:{start}"


def local_slice(tensor: Any) -> torch.Tensor | Slice | None:
    """What this rank publishes of a `DTensor`: its local shard as a `Slice`; a replicated tensor whole on the mesh's
    first rank only; None if this rank holds nothing. A plain tensor is returned as it is.

    Raises:
        ValueError: the shard is cut along more than one dimension, which the format does not describe.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return tensor
    chunks = tensor.__create_chunk_list__()  # what torch.distributed.checkpoint reads: offsets and sizes
    if len(chunks) != 1:
        raise ValueError(
            f"a DTensor of shape {tuple(tensor.shape)} holds {len(chunks)} chunks on this rank; "
            "pass delta.pieces.Slice values instead"
        )
    chunk = chunks[0]
    shape, sizes, offsets = tuple(tensor.shape), tuple(chunk.sizes), tuple(chunk.offsets)
    cut = [d for d in range(len(shape)) if sizes[d] != shape[d]]
    if len(cut) > 1:
        raise ValueError(
            f"a DTensor of shape {shape} with placements {tensor.placements} is cut along dims {cut}; "
            "publish from a 1-D mesh (one Shard placement) or pass delta.pieces.Slice values"
        )
    local = tensor.to_local()
    if not cut:
        coordinate = tensor.device_mesh.get_coordinate() or ()
        return local if all(c == 0 for c in coordinate) else None
    return Slice(local, shape, cut[0], offsets[cut[0]])


def flatten(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], PieceRecord]:
    """This rank's state as its files hold it (tensors under their names, slices under piece names, a whole slice under
    its tensor's, an empty one not at all), and what each piece is.

    Raises:
        ValueError: a slice outside its tensor, or with a shape that does not match its full shape.
    """
    tensors: dict[str, torch.Tensor] = {}
    record: PieceRecord = {}
    for name in sorted(state):
        value = local_slice(state[name])
        if value is None:
            continue
        if not isinstance(value, Slice):
            tensors[name] = value
            continue
        shape, dim, t = tuple(value.shape), value.dim, value.tensor
        expected = shape[:dim] + (value.stop - value.start,) + shape[dim + 1 :] if 0 <= dim < len(shape) else None
        if expected is None or tuple(t.shape) != expected or value.start < 0 or value.stop > shape[dim]:
            raise ValueError(
                f"slice of {name!r} (dim {dim}, start {value.start}, shape {tuple(t.shape)}) does not "
                f"fit in its full shape {shape}"
            )
        if value.stop == value.start:
            continue
        if value.start == 0 and value.stop == shape[dim]:
            tensors[name] = t
            continue
        piece = piece_name(name, dim, value.start)
        tensors[piece] = t
        record[piece] = (name, shape, dim, value.start, value.stop)
    return tensors, record


def layout_of(records: list[PieceRecord]) -> Layout:
    """The manifest's `pieces` table from every rank's piece records (checked by `check_layout`)."""
    cuts: dict[str, list[tuple[tuple[int, ...], int, str, int, int]]] = {}
    for record in records:
        for piece, (name, shape, dim, start, stop) in record.items():
            cuts.setdefault(name, []).append((tuple(shape), dim, piece, start, stop))
    layout: Layout = {}
    for name, pieces in sorted(cuts.items()):
        pieces.sort(key=lambda p: p[3])
        shape, dim = pieces[0][0], pieces[0][1]
        if any(p[0] != shape or p[1] != dim for p in pieces):
            raise DeltaFormatError(f"ranks disagree on the shape or cut dimension of {name!r}", tensor=name)
        layout[name] = Sharded(shape, dim, tuple((p, a, b) for _, _, p, a, b in pieces))
    return layout


def check_layout(layout: Mapping[str, Sharded], shards: tuple[tuple[str, ...], ...] | None) -> None:
    """Refuse a `pieces` table whose pieces do not tile their tensors exactly, each piece on exactly one rank, none
    named like a full tensor, and no sharded tensor held whole.

    Raises:
        DeltaFormatError: naming the tensor and what is wrong.
    """
    if layout and shards is None:
        raise DeltaFormatError("the manifest lists sharded tensors but no ranks' names (shards)")
    plain = sorted(layout.keys() & {n for names in shards or () for n in names})
    if plain:
        raise DeltaFormatError(
            f"{shown(plain[0])} is both cut into pieces and held whole by a rank; a tensor is "
            "one or the other: refusing the version"
        )
    held: dict[str, int] = {}
    for names in shards or ():
        for n in names:
            held[n] = held.get(n, 0) + 1
    for name, sharded in layout.items():
        shape, dim = sharded.shape, sharded.dim
        if not 0 <= dim < len(shape) or any(n < 0 for n in shape):
            raise DeltaFormatError(f"cut along dim {dim} of a tensor of shape {shape}", tensor=name)
        if not sharded.pieces:
            raise DeltaFormatError("no pieces: a sharded tensor has at least one", tensor=name)
        at = 0
        for piece, start, stop in sharded.pieces:
            if start != at or stop <= start:
                raise DeltaFormatError(
                    f"pieces do not tile it along dim {dim}: {piece!r} covers [{start}, {stop}) "
                    f"where [{at}, ...) comes next; refusing the version",
                    tensor=name,
                )
            if held.get(piece) != 1 or piece in layout:
                raise DeltaFormatError(
                    f"piece {piece!r} is held by {held.get(piece, 0)} ranks (must be exactly 1)", tensor=name
                )
            at = stop
        if at != shape[dim]:
            raise DeltaFormatError(
                f"pieces cover [0, {at}) of {shape[dim]} along dim {dim}; refusing the version", tensor=name
            )


def hash_keys(flat: Mapping[str, torch.Tensor], record: PieceRecord) -> dict[str, TensorKey]:
    """State-hash keys of the pieces in `flat`, so that a piece hashes its elements where they sit in the full tensor:
    the state hash does not depend on how a tensor is cut."""
    return {
        piece: TensorKey.piece(name, DTYPE_NAMES[flat[piece].dtype], tuple(shape), dim, start, stop)
        for piece, (name, shape, dim, start, stop) in record.items()
        if piece in flat
    }


def record_of(layout: Mapping[str, Sharded]) -> PieceRecord:
    """Every piece of a layout as `flatten` records it."""
    return {piece: (name, s.shape, s.dim, start, stop) for name, s in layout.items() for piece, start, stop in s.pieces}


def owners(layout: Mapping[str, Sharded]) -> dict[str, str]:
    """Piece name -> the full tensor it belongs to."""
    return {piece: name for name, sharded in layout.items() for piece, _, _ in sharded.pieces}


def _region(full: torch.Tensor, sharded: Sharded, start: int, stop: int) -> torch.Tensor:
    return full.narrow(sharded.dim, start, stop - start)


def assemble(flat: Mapping[str, torch.Tensor], layout: Mapping[str, Sharded]) -> dict[str, torch.Tensor]:
    """Full tensors from pieces (new tensors for the sharded ones; the others are passed through).

    Raises:
        DeltaFormatError: a piece is missing, or its shape or dtype does not fit its tensor.
    """
    pieces_of = owners(layout)
    full = {n: t for n, t in flat.items() if n not in pieces_of}
    for name, sharded in layout.items():
        parts: list[torch.Tensor] = []
        for piece, start, stop in sharded.pieces:
            t = flat.get(piece)
            want = sharded.shape[: sharded.dim] + (stop - start,) + sharded.shape[sharded.dim + 1 :]
            if t is None or tuple(t.shape) != want:
                got = None if t is None else tuple(t.shape)
                raise DeltaFormatError(f"piece {piece!r} has shape {got}, the layout says {want}", tensor=name)
            if parts and t.dtype != parts[0].dtype:
                raise DeltaFormatError(f"pieces hold {parts[0].dtype} and {t.dtype}", tensor=name)
            parts.append(t)
        full[name] = torch.cat(parts, dim=sharded.dim)
    return full


def piece_views(full: Mapping[str, torch.Tensor], layout: Mapping[str, Sharded]) -> dict[str, torch.Tensor]:
    """The pieces of full tensors, under piece names: views where the range is contiguous (FSDP2's dim-0 shards), else
    copies (to `write_back`).

    Raises:
        DeltaFormatError: a sharded tensor is missing or has another shape than the layout says.
    """
    flat = {n: t for n, t in full.items() if n not in layout}
    for name, sharded in layout.items():
        t = full.get(name)
        if t is None or tuple(t.shape) != sharded.shape:
            raise DeltaFormatError(
                f"the state holds {None if t is None else tuple(t.shape)}, the layout says {sharded.shape}", tensor=name
            )
        for piece, start, stop in sharded.pieces:
            flat[piece] = _region(t, sharded, start, stop).contiguous()
    return flat


def write_back(
    full: Mapping[str, torch.Tensor],
    flat: Mapping[str, torch.Tensor],
    layout: Mapping[str, Sharded],
    pieces: set[str] | None = None,
) -> None:
    """Copy pieces (all, or those in `pieces`) that are not views into their full tensors, in place."""
    for name, sharded in layout.items():
        for piece, start, stop in sharded.pieces:
            if pieces is not None and piece not in pieces:
                continue
            region = _region(full[name], sharded, start, stop)
            if flat[piece].data_ptr() != region.data_ptr() or not region.is_contiguous():
                region.copy_(flat[piece])


def split(
    state: Mapping[str, torch.Tensor], rank: int, world: int, min_numel: int = MIN_SPLIT_NUMEL
) -> dict[str, torch.Tensor | Slice]:
    """This rank's share of a state every rank holds whole: tensors of at least `min_numel` elements cut along dim 0 as
    `torch.chunk` does, smaller ones whole to the rank with the fewest bytes so far; the same plan on every rank."""
    if not 0 <= rank < world:
        raise ValueError(f"rank must be in [0, {world}), got {rank}")
    share: dict[str, torch.Tensor | Slice] = {}
    load = [0] * world
    for name in sorted(state):
        t = state[name]
        if world > 1 and t.dim() >= 1 and t.numel() >= min_numel and t.shape[0] >= world:
            rows = -(-t.shape[0] // world)
            start = min(rank * rows, t.shape[0])
            share[name] = Slice(t.narrow(0, start, min(rows, t.shape[0] - start)), tuple(t.shape), 0, start)
            continue
        owner = min(range(world), key=lambda r: load[r])
        load[owner] += t.numel() * t.element_size()
        if owner == rank:
            share[name] = t
    return share
