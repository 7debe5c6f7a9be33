"""The reader's second stage: every chunk's rANS words decoded, its changes placed against the old tensor and their
hash moves proven, a range of chunks per compiled call, ranges taken by the worker threads.

The stage's tables: for host tensors, the parsed rows themselves (`_parsed`'s columns, ENTRY numbered within one
dtype), which `place_rows` decodes and places in one pass; for the device path and for `check`, `DecodeTable`'s
rows (columns FAMILY..OUT), which `decode_rows` decodes into class-major lists (`_device_scan.locate` places them).
Every kernel returns an error code (`_rans`' named codes) and the row it stopped at instead of raising, so that
the first bad chunk in file order is the one reported.
"""

from __future__ import annotations

import contextvars
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from .._cores import in_threads, slices, typed
from .._stages import stage
from ..errors import DeltaFormatError
from ..tensors import _device, _groups, _sumhash
from ..tensors._sumhash import TensorKey
from ..tensors.bits import DTYPES_BY_NAME, bits, layout_of
from . import _device_scan, _parsed, _rans
from ._base import Change
from ._found import key_tables, sum_by
from ._kernels import locate_chunk
from ._models import GAP, STEP
from ._parsed import Parsed

# Columns of a decoding row (`decode_rows`): the row's family (width, classes) of models, the tensor's bit width,
# the chunk's elements, its changes, its words [W0, W1), its lowest and highest class with a change, where its
# changes go in the output arrays.
FAMILY, WIDTH, SIZE, COUNT, W0, W1, CLASS_LO, CLASS_HI, OUT = range(9)


@dataclass
class DecodeTable:
    """What `decode_rows` reads besides the words and the models' tables.

    Attributes:
        rows: A row per chunk (columns FAMILY..OUT), in the parsed rows' order.
        gap_models, step_models: Per family, the model of each class (-1: none), padded to the most classes.
    """

    rows: np.ndarray
    gap_models: np.ndarray
    step_models: np.ndarray

    @classmethod
    def of(cls, parsed: Parsed) -> DecodeTable:
        """The decoding rows of every parsed row (OUT left 0: the caller's to set, or check only)."""
        families: dict[tuple[int, int], int] = {}
        family, width = [], []
        for e in parsed.entries:
            dtype = DTYPES_BY_NAME[e.dtype]
            w, classes = layout_of(dtype).itemsize * 8, parsed.classing.field(dtype)[1] + 1
            family.append(families.setdefault((w, classes), len(families)))
            width.append(w)
        most = max([c for _, c in families] + [1])
        gap_models = np.full((max(1, len(families)), most), -1, np.int32)
        step_models = gap_models.copy()
        for (w, classes), f in families.items():
            gap_models[f, :classes] = parsed.models.of(GAP, w, classes)
            step_models[f, :classes] = parsed.models.of(STEP, w, classes)
        rows, entry = parsed.rows, parsed.rows[:, _parsed.ENTRY]
        table = np.zeros((len(rows), 9), np.int64)
        table[:, FAMILY], table[:, WIDTH] = np.array(family, np.int64)[entry], np.array(width, np.int64)[entry]
        table[:, SIZE] = _parsed.sizes(rows, np.array([e.numel for e in parsed.entries], np.int64), parsed.chunk)
        table[:, COUNT], table[:, W0], table[:, W1] = rows[:, _parsed.COUNT], rows[:, _parsed.W0], rows[:, _parsed.W1]
        table[:, CLASS_LO], table[:, CLASS_HI] = rows[:, _parsed.CLASS_LO], rows[:, _parsed.CLASS_HI]
        return cls(table, gap_models, step_models)


@njit(nogil=True, cache=True)
def decode_rows(words, rows, gap_models, step_models, freq, cum, lut, cls, ranks, steps):  # pragma: no cover
    """rANS-decode the chunks `rows` (columns FAMILY..OUT) into cls/ranks/steps at each row's OUT offset, class
    by class with ranks ascending in each chunk; with empty outputs, check the streams only (memory
    independent of the changes). Returns (error code, row) — (0, -1) when every chunk decodes."""
    store = cls.size > 0
    for r in range(rows.shape[0]):
        f, count, at = rows[r, FAMILY], rows[r, COUNT], rows[r, OUT]
        room = count if store else 0
        err = _rans.decode_chunk(
            words[rows[r, W0] : rows[r, W1]],
            rows[r, CLASS_LO],
            rows[r, CLASS_HI],
            rows[r, SIZE],
            rows[r, WIDTH],
            gap_models[f],
            step_models[f],
            freq,
            cum,
            lut,
            count,
            cls[at : at + room],
            ranks[at : at + room],
            steps[at : at + room],
        )
        if err:
            return err, r
    return 0, -1


@njit(nogil=True, cache=True)
def place_rows(
    words,
    rows,
    a_list,
    pos_list,
    val_list,
    dense,
    shift,
    mask,
    chunk,
    gap_model,
    step_model,
    freq,
    cum,
    lut,
    ikeys,
    seeds,
    moved,
):  # pragma: no cover - compiled
    """Decode the chunks `rows` (parsed rows, ENTRY: a tensor of `a_list`, tensors of one dtype) and place their
    changes: positions and new values into `pos_list[t]`/`val_list[t]` from the row's FIRST on, or, for a `dense`
    tensor, the new values straight into `val_list[t]` (a copy of the old tensor). Hash moves per row into
    `moved`. Returns (error code, row) — (0, -1) when every chunk decodes and places."""
    width = a_list[0].itemsize * 8
    most = 1
    for r in range(rows.shape[0]):
        most = max(most, rows[r, _parsed.COUNT])
    cls, ranks = np.empty(most, np.uint16), np.empty(most, np.int32)
    steps, val_scratch = np.empty(most, a_list[0].dtype), np.empty(most, a_list[0].dtype)
    pos_scratch = np.empty(most, np.int64)
    for r in range(rows.shape[0]):
        t, k, count, at = rows[r, _parsed.ENTRY], rows[r, _parsed.CHUNK], rows[r, _parsed.COUNT], rows[r, _parsed.FIRST]
        a = a_list[t]
        start = k * chunk
        end = min(a.size, start + chunk)
        err = _rans.decode_chunk(
            words[rows[r, _parsed.W0] : rows[r, _parsed.W1]],
            rows[r, _parsed.CLASS_LO],
            rows[r, _parsed.CLASS_HI],
            end - start,
            width,
            gap_model,
            step_model,
            freq,
            cum,
            lut,
            count,
            cls[:count],
            ranks[:count],
            steps[:count],
        )
        if err:
            return err, r
        key = (ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1])
        if dense[t]:
            positions, values = pos_scratch[:count], val_scratch[:count]
        else:
            positions, values = pos_list[t][at : at + count], val_list[t][at : at + count]
        err, h0, h1 = locate_chunk(
            a, start, end, shift, mask, cls[:count], ranks[:count], steps[:count], positions, values, key
        )
        if err:
            return err, r
        if dense[t]:
            out = val_list[t]
            for j in range(count):
                out[positions[j]] = values[j]
        moved[r, 0], moved[r, 1] = h0, h1
    return 0, -1


def _raise_at(parsed: Parsed, err: int, row: int) -> None:
    entry, chunk = parsed.rows[row, _parsed.ENTRY], parsed.rows[row, _parsed.CHUNK]
    raise DeltaFormatError(
        f"chunk at element {int(chunk) * parsed.chunk} does not decode: {_rans.DECODE_ERRORS[err]}",
        tensor=parsed.entries[int(entry)].name,
    )


def decode_on_host(
    parsed: Parsed,
    chosen: list[int],
    state: Mapping[str, torch.Tensor],
    workers: int,
    keys: Mapping[str, TensorKey] | None,
) -> dict[str, Change]:
    """Decode, place and hash the changes of entries `chosen` (host tensors), dtype by dtype: one compiled call
    per range of chunks, ranges taken by `workers` threads."""
    entries, rows, models, chunk = parsed.entries, parsed.rows, parsed.models, parsed.chunk
    changes = {}
    by_dtype: dict[torch.dtype, list[int]] = defaultdict(list)
    for i in chosen:
        by_dtype[state[entries[i].name].dtype].append(i)
    for dtype, members in by_dtype.items():
        shift, mask = parsed.classing.field(dtype)
        names = [entries[i].name for i in members]
        a = [bits(state[n]) for n in names]
        dense = np.array([entries[i].changed * (8 + x.itemsize) > x.nbytes for i, x in zip(members, a, strict=True)])
        # Positions and values would take more room than the tensor where `dense`: build the new tensor
        # instead (a copy of the old one with each chunk's changes written in), so no delta costs the reader
        # more than one copy of each tensor it changes.
        pos = [np.empty(0 if d else entries[i].changed, np.int64) for i, d in zip(members, dense, strict=True)]
        val = [
            x.copy() if d else np.empty(entries[i].changed, x.dtype) for i, x, d in zip(members, a, dense, strict=True)
        ]
        local = np.full(len(entries), -1, np.int64)
        local[members] = np.arange(len(members))
        sel = np.flatnonzero(local[rows[:, _parsed.ENTRY]] >= 0)
        placed = rows[sel]
        placed[:, _parsed.ENTRY] = local[placed[:, _parsed.ENTRY]]
        ikeys, seeds = key_tables(keys, names)
        width = a[0].itemsize * 8
        classes = parsed.classing.classes(width)
        lists = (typed(a), typed(pos), typed(val))
        view = a[0].dtype.type
        moved = np.zeros((len(placed), 2), np.uint64)

        def run(
            lo: int,
            hi: int,
            placed=placed,
            lists=lists,
            dense=dense,
            shift=view(shift),
            mask=view(mask),
            gap_model=models.of(GAP, width, classes),
            step_model=models.of(STEP, width, classes),
            ikeys=ikeys,
            seeds=seeds,
            moved=moved,
        ) -> tuple[int, int]:
            err, row = place_rows(
                parsed.words,
                placed[lo:hi],
                *lists,
                dense,
                shift,
                mask,
                chunk,
                gap_model,
                step_model,
                models.freq,
                models.cum,
                models.lut,
                ikeys,
                seeds,
                moved[lo:hi],
            )
            return err, (lo + row if err else -1)

        # cost: the context scan walks every element of a chunk; `gap` only its changes
        cost = (
            _parsed.sizes(placed, np.array([len(x) for x in a], np.int64), chunk)
            if parsed.classing.context
            else placed[:, _parsed.COUNT]
        )
        spans = slices(cost, workers)
        with stage("decode"):  # rANS, placing and hashing each change
            failed = [(row, err) for err, row in in_threads(run, spans, workers) if err]
        if failed:
            row, err = min(failed)
            _raise_at(parsed, err, int(sel[row]))
        sums = sum_by(placed[:, _parsed.ENTRY], moved, len(members))
        for t, name in enumerate(names):
            changes[name] = Change(
                name,
                None if dense[t] else pos[t],
                val[t],
                (int(sums[t, 0]), int(sums[t, 1])) if keys is not None else None,
            )
    return changes


def decode_on_device(
    parsed: Parsed,
    chosen: list[int],
    state: Mapping[str, torch.Tensor],
    workers: int,
    keys: Mapping[str, TensorKey] | None,
) -> dict[str, Change]:
    """Decode each group's chunks on host threads into staging memory, then place them on the device
    (`_device_scan.locate`): the host decodes group k + 1 while the device places group k."""
    if not chosen:
        return {}
    entries, rows, chunk = parsed.entries, parsed.rows, parsed.chunk
    names = [entries[i].name for i in chosen]
    index = {e.name: i for i, e in enumerate(entries)}
    groups = _groups.groups(state, names, chunk)
    table = DecodeTable.of(parsed)
    parts: dict[str, list[tuple[torch.Tensor, torch.Tensor, _sumhash.Sums | None]]] = defaultdict(list)
    device = state[names[0]].device
    bounds = np.searchsorted(rows[:, _parsed.ENTRY], np.arange(len(entries) + 1))  # each entry's rows

    def decode_group(
        group: _groups.Group, staging: _device.Staging
    ) -> tuple[_device_scan.Decoded | None, tuple[int, int] | None]:
        picked = []
        for t, name in enumerate(group.names):  # the member's rows: its chunks inside the group's part
            lo, hi = bounds[index[name]], bounds[index[name] + 1]
            first = group.first_chunk(t)
            k = rows[lo:hi, _parsed.CHUNK]
            last = first + -(-group.sizes[t] // chunk)
            picked.append(np.arange(lo + np.searchsorted(k, first), lo + np.searchsorted(k, last)))
        sel = np.concatenate(picked)
        counts = [int(rows[p, _parsed.COUNT].sum()) for p in picked]
        total = int(rows[sel, _parsed.COUNT].sum())
        width = state[group.names[0]].element_size() * 8
        pinned = device.type != "cpu"
        cls = staging.empty(total, np.uint16, pinned)
        ranks = staging.empty(total, np.int32, pinned)
        steps = staging.empty(total, _groups.UINT[width // 8], pinned)
        part = table.rows[sel]
        part[:, OUT] = np.cumsum(part[:, COUNT]) - part[:, COUNT]
        spans = slices(part[:, COUNT], workers)
        with stage("decode"):
            failed = [
                (lo + row, err)
                for (lo, _), (err, row) in zip(
                    spans,
                    in_threads(
                        lambda lo, hi: decode_rows(
                            parsed.words,
                            part[lo:hi],
                            table.gap_models,
                            table.step_models,
                            parsed.models.freq,
                            parsed.models.cum,
                            parsed.models.lut,
                            cls,
                            ranks,
                            steps,
                        ),
                        spans,
                        workers,
                    ),
                    strict=True,
                )
                if err
            ]
        if failed:
            row, err = min(failed)
            return None, (err, int(sel[row]))
        member = np.repeat(np.arange(len(group.names)), [p.size for p in picked])
        gchunk = group.chunk_base[member] + rows[sel, _parsed.CHUNK] - np.array(group.starts, np.int64)[member] // chunk
        return _device_scan.Decoded(cls, ranks, steps, gchunk, rows[sel, _parsed.COUNT], counts), None

    with ThreadPoolExecutor(1, thread_name_prefix="delta-decode") as host_stage:
        stagings = [_device.Staging() for _ in groups]
        ahead = [
            host_stage.submit(contextvars.copy_context().run, decode_group, g, s)
            for g, s in zip(groups[:1], stagings[:1], strict=True)
        ]
        try:
            for k, group in enumerate(groups):
                decoded, failure = ahead[k].result()
                if k + 1 < len(groups):  # the host decodes the next group while the device places this one
                    ahead.append(
                        host_stage.submit(contextvars.copy_context().run, decode_group, groups[k + 1], stagings[k + 1])
                    )
                if failure is not None:
                    _raise_at(parsed, *failure)
                shift, mask = parsed.classing.field(state[group.names[0]].dtype)
                assert decoded is not None  # a failure raised above
                got = _device_scan.locate(state, group, shift, mask, decoded, keys)
                stagings[k].close()  # `locate` waited for the device: the uploads are done
                if got.bad is not None:
                    raise DeltaFormatError(
                        f"a chunk does not decode: {_rans.DECODE_ERRORS[_rans.RANK_PAST_CLASS]}",
                        tensor=group.names[got.bad],
                    )
                for t, name in enumerate(group.names):
                    parts[name].append((got.positions[t], got.values[t], got.sums[t] if got.sums else None))
        finally:
            for f in ahead:
                f.cancel()
            wait(ahead)
            for s in stagings:
                s.close()
    changes = {}
    for name, pieces in parts.items():
        positions, values, moved = zip(*pieces, strict=True)
        sums = None
        if keys is not None:
            sums = _sumhash.ZERO
            for m in moved:
                sums = _sumhash.add(sums, m)
        changes[name] = Change(
            name,
            positions[0] if len(pieces) == 1 else torch.cat(positions),
            values[0] if len(pieces) == 1 else torch.cat(values),
            sums,
        )
    return changes


def check(parsed: Parsed, workers: int) -> None:
    """Decode every chunk's words without the state (`Codec.check`), one compiled call per range of chunks.

    Raises:
        DeltaFormatError: for the first chunk in file order that does not decode.
    """
    table = DecodeTable.of(parsed)
    none16, none32, noneu = np.empty(0, np.uint16), np.empty(0, np.int32), np.empty(0, np.uint64)
    spans = slices(table.rows[:, COUNT], workers)
    failed = [
        (lo + row, err)
        for (lo, _), (err, row) in zip(
            spans,
            in_threads(
                lambda lo, hi: decode_rows(
                    parsed.words,
                    table.rows[lo:hi],
                    table.gap_models,
                    table.step_models,
                    parsed.models.freq,
                    parsed.models.cum,
                    parsed.models.lut,
                    none16,
                    none32,
                    noneu,
                ),
                spans,
                workers,
            ),
            strict=True,
        )
        if err
    ]
    if failed:
        row, err = min(failed)
        _raise_at(parsed, err, row)
