"""Codecs `ctx` (the default) and `gap`: independent chunks of class-rank gaps and ULP steps under rANS.

Values are stored relative to the old value the reader holds (the difference of the bit patterns in float order,
zigzag folded: a one-ULP step is a small number). `ctx` conditions on the old value: after an AdamW step at RL
learning rates a bf16 weight changes only if the step exceeds half its ULP, which its exponent sets, so elements are
classed by the old value's exponent, positions coded as gaps between ranks inside the class (the reader recovers
them from its own old tensor), and every (kind, width, class) has its own model. `gap` is the same with one class.

Tensors are cut into chunks coded independently: the chunks of many tensors are rows of one table, each thread one
compiled call over its slice. The stages, each with its table beside its kernels: find the changes (`_found`, on a
device `_device_scan`), count and model (`_models`), plan and code (`_plan`); parse (`_parsed`) and decode
(`_decode`). Streams `models`, `chunks` and `words`: their layout is in docs/delta.md, "Codecs"."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from .._cores import resolve_workers
from .._stages import stage
from ..tensors import _device
from ..tensors._sumhash import TensorKey
from ..tensors.bits import DTYPE_NAMES
from . import _decode, _device_scan, _found, _parsed
from ._base import Change, Codec, Encoded, TensorEntry
from ._models import Classing, Counts, WriterModels
from ._plan import Plan, code
from ._streams import pack
from ._workspace import Workspace


class ChunkedCodec(Codec):
    """Class-rank gaps + ULP steps in independent chunks under rANS; `context=False` is `gap` (one class)."""

    form = "sparse"

    def __init__(self, context: bool) -> None:
        self.classing = Classing(context)
        self.name = "ctx" if context else "gap"
        self.description = (
            "gaps of in-class ranks (class = old exponent) + ULP steps, rANS per class, chunked"
            if context
            else "position gaps + ULP steps, rANS, chunked"
        )

    def encode(
        self,
        old: Mapping[str, torch.Tensor],
        new: Mapping[str, torch.Tensor],
        names: list[str],
        progress: bool = False,
        workers: int | None = None,
        chunk: int | None = None,
        keys: Mapping[str, TensorKey] | None = None,
        workspace: Workspace | None = None,
    ) -> Encoded:
        chunk = _found.chunk_size(chunk)
        workers = resolve_workers(workers)
        names = sorted(names)
        counts = Counts(self.classing, workers, chunk)
        moved = np.zeros((len(names), 2), np.uint64)  # per tensor, the hash lanes' moves
        workspace = Workspace() if workspace is None else workspace
        with workspace, _device.Staging() as staging:  # the device scans' host copies live until coded
            found = _device_scan.scan_on_device(
                old,
                new,
                names,
                keys,
                counts,
                moved,
                workers,
                staging,
                f"diff {self.name} on the device" if progress else None,
            )
            with stage("scan"):  # the host scan hashes and counts symbols as it goes: all in this stage
                found += _found.scan_on_host(
                    old, new, names, keys, counts, moved, workers, f"diff {self.name}" if progress else None
                )
            with stage("code"):
                models, filling = WriterModels.building(counts, workers, workspace)
                with filling:  # the models' tables fill on the other threads meanwhile
                    plan = Plan.of(found)
                coded = code(plan, models, self.classing, workers, workspace)
            rows = np.concatenate([[chunk], coded.rows.reshape(-1)]).astype(np.uint32)
            blobs = {
                "models": pack(models.to_table(), threads=workers),
                "chunks": pack(rows, threads=workers),
                "words": coded.words.astype("<u2", copy=False).view(np.uint8),
            }
            streams = {
                k: torch.frombuffer(bytearray(v), dtype=torch.uint8)
                if len(v)
                # out of the workspace
                else torch.empty(0, dtype=torch.uint8)
                for k, v in blobs.items()
            }
        changed = np.bincount(coded.tensor, weights=coded.rows[:, _parsed.S_COUNT], minlength=len(names)).astype(
            np.int64
        )
        entries = [
            TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), "sparse", int(c))
            for name, c in zip(names, changed.tolist(), strict=True)
            if c
        ]
        sums = (
            {name: (int(moved[i, 0]), int(moved[i, 1])) for i, name in enumerate(names) if changed[i]}
            if keys is not None
            else None
        )
        return Encoded(entries, streams, sums)

    def stream_names(self, entries: tuple[TensorEntry, ...]) -> set[str]:
        return set(_parsed.STREAMS)

    def check_streams(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> None:
        _parsed.check_streams(blobs)

    def decode(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor],
        workers: int | None = None,
        keys: Mapping[str, TensorKey] | None = None,
        workspace: Workspace | None = None,
    ) -> list[Change]:
        workers = resolve_workers(workers)
        workspace = Workspace() if workspace is None else workspace
        with workspace:
            parsed = _parsed.parse(entries, blobs, self.classing, workspace)
            on_device = [i for i, e in enumerate(entries) if not _device.on_host(state[e.name])]
            on_host = [i for i, e in enumerate(entries) if _device.on_host(state[e.name])]
            changes = _decode.decode_on_device(parsed, on_device, state, workers, keys)
            changes.update(_decode.decode_on_host(parsed, on_host, state, workers, keys))
        return [changes[e.name] for e in entries]

    def check(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        workers: int | None = None,
        foreign: bool = False,
    ) -> str:
        """Every chunk's words decoded without the state: the rANS stream ends on its initial state with
        every word used, holds as many changes per class range as the chunk table says, ranks below the
        chunk's size, steps within the dtype's width. Not checkable without the old tensor: for `ctx`,
        that each rank exists in its class of the old tensor; for both, the new values themselves."""
        parsed = _parsed.parse(entries, blobs, self.classing, Workspace())
        _decode.check(parsed, resolve_workers(workers))
        where = (
            "class ranks inside their chunk"
            if self.classing.context
            else "positions inside their chunk, strictly increasing"
        )
        return (
            f"{len(entries)} tensors in {len(parsed.rows)} chunks, every chunk's rANS words decoding exactly to "
            f"the chunk table's counts, with {where} and steps within each dtype's width"
        )

    def tensor_bytes(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Each tensor's rANS words, plus its share of the tables by the share of words it holds."""
        rows = _parsed.parse(entries, blobs, self.classing, Workspace()).rows
        tables = sum(v.numel() for k, v in blobs.items() if k != "words")
        own = 2 * np.bincount(
            rows[:, _parsed.ENTRY], weights=rows[:, _parsed.W1] - rows[:, _parsed.W0], minlength=len(entries)
        ).astype(np.int64)
        total = max(1, int(own.sum()))
        return {e.name: int(n) + round(tables * int(n) / total) for e, n in zip(entries, own.tolist(), strict=True)}
