"""The reader's first stage: the streams of a `gap`/`ctx` delta parsed and checked against the header, every count
against the tensor sizes and the stream lengths before anything the size of a tensor is allocated.

The stage's tables: the rows of stream `chunks` as the file holds them (columns S_CHUNK..S_CLASS_HI; the writer's
`_plan.code` writes them), and `Parsed.rows` (columns ENTRY..FIRST), which say where each chunk's words and changes
lie. `walk_rows` makes the one from the other, checking each row as it goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from ..errors import DeltaFormatError
from ..tensors.bits import DTYPES_BY_NAME, layout_of
from . import _rans
from ._base import TensorEntry
from ._found import MAX_CHUNK
from ._models import GAP, STEP, Classing, Key, ReaderModels
from ._streams import unpack
from ._workspace import Workspace

STREAMS = frozenset({"models", "chunks", "words"})

# Columns of a row of stream `chunks` (after its first value, the chunk size): the chunk's number in its tensor,
# its changes, its rANS words, its lowest and highest class with a change.
S_CHUNK, S_COUNT, S_WORDS, S_CLASS_LO, S_CLASS_HI = range(5)

# Columns of `Parsed.rows`: the entry (in the header's order), the chunk's number in its tensor, its changes, its
# words [W0, W1) in stream `words`, its lowest and highest class with a change, its first change among its
# entry's changes.
ENTRY, CHUNK, COUNT, W0, W1, CLASS_LO, CLASS_HI, FIRST = range(8)

# What `walk_rows` found: the slots of the array it returns. On an error, the row and the entry it stopped at and
# the entry's changes held by then; otherwise the rows and words the entries used.
WALK_ERROR, WALK_ROW, WALK_ENTRY, WALK_HELD, WALK_ROWS, WALK_WORDS = range(6)
# Its errors (slot WALK_ERROR; 0: none).
TABLE_SHORT = 1  # the table ends before an entry's count is reached
ROW_MALFORMED = 2  # chunks not ascending or past the tensor, a count of 0 or past what is left, under 2 words,
# classes out of order or past the dtype's


@dataclass
class Parsed:
    """A delta's streams, parsed and checked.

    Attributes:
        entries: The header's entries, which the streams were checked against.
        classing: How the codec that wrote them splits elements into classes.
        models: The reader's models (in a `Workspace`: valid while the call holds it).
        rows: A row per chunk with changes (int64, columns ENTRY..FIRST), entries in order, chunks ascending.
        words: Stream `words` (uint16).
        chunk: The chunk size.
    """

    entries: tuple[TensorEntry, ...]
    classing: Classing
    models: ReaderModels
    rows: np.ndarray
    words: np.ndarray
    chunk: int


@njit(inline="always")
def _stopped(out, error, row, entry, held):  # pragma: no cover - compiled
    out[WALK_ERROR], out[WALK_ROW], out[WALK_ENTRY], out[WALK_HELD] = error, row, entry, held
    return out


@njit(cache=True)
def walk_rows(stream, changed, numel, masks, chunk, rows):  # pragma: no cover - compiled
    """Assign the rows of stream `chunks` (columns S_CHUNK..S_CLASS_HI) to the entries in order, an entry's rows
    ending where their counts reach its count, checking each row as it goes, and write them as parsed rows
    (columns ENTRY..FIRST) into `rows`. Returns what it found (slots WALK_ERROR..WALK_WORDS)."""
    out = np.zeros(6, np.int64)
    row, at = 0, 0
    for e in range(changed.size):
        held, previous = 0, -1
        chunks = max(1, -(-numel[e] // chunk))
        while held < changed[e]:
            if row >= stream.shape[0]:
                return _stopped(out, TABLE_SHORT, row, e, held)
            k, count, words = stream[row, S_CHUNK], stream[row, S_COUNT], stream[row, S_WORDS]
            lo, hi = stream[row, S_CLASS_LO], stream[row, S_CLASS_HI]
            size = min(numel[e], (k + 1) * chunk) - k * chunk
            if (
                not previous < k < chunks
                or not 1 <= count <= min(size, changed[e] - held)
                or words < 2
                or not 0 <= lo <= hi <= masks[e]
            ):
                return _stopped(out, ROW_MALFORMED, row, e, held)
            rows[row, ENTRY], rows[row, CHUNK], rows[row, COUNT], rows[row, FIRST] = e, k, count, held
            rows[row, W0], rows[row, W1], rows[row, CLASS_LO], rows[row, CLASS_HI] = at, at + words, lo, hi
            held += count
            previous = k
            at += words
            row += 1
    out[WALK_ROWS], out[WALK_WORDS] = row, at
    return out


def check_streams(blobs: Mapping[str, torch.Tensor]) -> None:
    """Every stream a 1-D uint8 tensor (`Codec.check_streams`)."""
    for name in sorted(STREAMS):
        blob = blobs.get(name)
        if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
            raise DeltaFormatError(
                f"stream {name!r} must be a 1-D uint8 tensor, got "
                f"{'nothing' if blob is None else f'{blob.dtype} {tuple(blob.shape)}'}"
            )


def parse(
    entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor], classing: Classing, workspace: Workspace
) -> Parsed:
    """The streams of `entries` parsed, every count checked: the chunk table is bounded by the words it describes,
    the models by the classes and counts of the chunk table. The models' tables are `workspace`'s memory.

    Raises:
        DeltaFormatError: an entry, a stream or a row is malformed, or the streams disagree.
    """
    for e in entries:
        if e.form != "sparse":
            raise DeltaFormatError(f"form {e.form!r} is not one of this codec's", tensor=e.name)
        if e.dtype not in DTYPES_BY_NAME:
            raise DeltaFormatError(f"dtype {e.dtype!r} is not supported", tensor=e.name)
        if not 0 < e.changed <= e.numel:
            raise DeltaFormatError(f"{e.changed} changed elements in a tensor of {e.numel}", tensor=e.name)
    if set(blobs) != STREAMS:
        raise DeltaFormatError(f"streams are {sorted(blobs)[:6]}, expected {sorted(STREAMS)}")
    check_streams(blobs)
    raw = {k: v.numpy().tobytes() for k, v in blobs.items()}
    if len(raw["words"]) % 2:
        raise DeltaFormatError("stream 'words' is not a whole number of 16-bit words")
    words = np.frombuffer(raw["words"], "<u2")
    head = unpack(raw["chunks"], np.uint32, None, "chunks", 1 + 5 * (words.size // 2))
    if head.size < 1 or not 1 <= int(head[0]) <= MAX_CHUNK or (head.size - 1) % 5:
        raise DeltaFormatError(
            f"stream 'chunks' is malformed: chunk size {int(head[0]) if head.size else None} "
            f"(must be in [1, {MAX_CHUNK}]), {head.size - 1} values (a multiple of 5)"
        )
    chunk = int(head[0])
    stream = head[1:].reshape(-1, 5).astype(np.int64)
    dtypes = [DTYPES_BY_NAME[e.dtype] for e in entries]
    masks = np.array([classing.field(d)[1] for d in dtypes], np.int64)
    widths = np.array([layout_of(d).itemsize * 8 for d in dtypes], np.int64)
    numel = np.array([e.numel for e in entries], np.int64)
    changed = np.array([e.changed for e in entries], np.int64)
    rows = np.empty((len(stream), 8), np.int64)
    walk = walk_rows(stream, changed, numel, masks, chunk, rows)
    bad = entries[walk[WALK_ENTRY]].name if walk[WALK_ERROR] else None
    if walk[WALK_ERROR] == TABLE_SHORT:
        raise DeltaFormatError(
            f"stream 'chunks' ends after {walk[WALK_HELD]} of {changed[walk[WALK_ENTRY]]} changed elements", tensor=bad
        )
    if walk[WALK_ERROR] == ROW_MALFORMED:
        k, count, n_words, lo, hi = stream[walk[WALK_ROW]].tolist()
        raise DeltaFormatError(
            f"chunk row {walk[WALK_ROW] + 1} is malformed (chunk {k}, {count} changed, {n_words} "
            f"words, classes {lo}..{hi})",
            tensor=bad,
        )
    if walk[WALK_ROWS] != len(stream) or walk[WALK_WORDS] != words.size:
        raise DeltaFormatError(
            f"streams 'chunks' and 'words' hold data no tensor uses ({len(stream) - walk[WALK_ROWS]}"
            f" rows, {words.size - walk[WALK_WORDS]} words)"
        )
    allowed = _allowed(rows, widths, numel, chunk, classing)
    data = unpack(raw["models"], np.uint32, None, "models", _most_model_values(rows, allowed))
    return Parsed(entries, classing, ReaderModels.parse(data, allowed, workspace), rows, words, chunk)


def sizes(rows: np.ndarray, numel: np.ndarray, chunk: int) -> np.ndarray:
    """Elements of each parsed row's chunk (`numel`: of each entry)."""
    return np.minimum(numel[rows[:, ENTRY]], (rows[:, CHUNK] + 1) * chunk) - rows[:, CHUNK] * chunk


def _allowed(rows: np.ndarray, widths: np.ndarray, numel: np.ndarray, chunk: int, classing: Classing) -> dict[Key, int]:
    """Per model the chunk table's classes can use, the largest symbol its values can need: a gap is below its
    chunk's size, a step minus one below 2**width - 1."""
    allowed: dict[Key, int] = {}
    size = sizes(rows, numel, chunk)
    width_of = widths[rows[:, ENTRY]]
    for width in np.unique(width_of).tolist():
        sel = width_of == width
        span = np.zeros(classing.classes(width) + 1, np.int64)  # classes some chunk of this width spans
        np.add.at(span, rows[sel, CLASS_LO], 1)
        np.add.at(span, rows[sel, CLASS_HI] + 1, -1)
        gap_top, step_top = _rans.symbol_of(int(size[sel].max()) - 1), _rans.symbol_of((1 << width) - 2)
        for c in np.flatnonzero(np.cumsum(span)[:-1] > 0).tolist():
            allowed[(GAP, width, c)] = gap_top
            allowed[(STEP, width, c)] = step_top
    return allowed


def _most_model_values(rows: np.ndarray, allowed: dict[Key, int]) -> int:
    """The most values stream `models` can hold: 4 per model, 2 per (symbol, frequency) pair, pairs bounded by the
    symbols the changes can need (a gap and a step per change, an END per class) and by the alphabets."""
    symbols = int((2 * rows[:, COUNT] + rows[:, CLASS_HI] - rows[:, CLASS_LO] + 1).sum())
    pairs = 0
    for key, top in allowed.items():
        pairs += top + 1 + (key[0] == GAP)
    return 4 * len(allowed) + 2 * min(symbols, pairs)
