"""What a delta file holds, per tensor, without the state it applies to."""

from __future__ import annotations

from dataclasses import dataclass

from .codecs import Codec, get_codec
from .errors import DeltaFormatError, printable
from .format import DeltaHeader, read_delta


@dataclass(frozen=True)
class TensorStats:
    """One changed tensor: elements, changed elements, storage form and bytes it costs alone."""

    name: str
    elements: int
    changed: int
    form: str
    bytes: int

    @property
    def density(self) -> float:
        return self.changed / self.elements if self.elements else 0.0


@dataclass(frozen=True)
class DeltaInfo:
    """A delta's header, file size and per-tensor statistics."""

    header: DeltaHeader
    file_bytes: int
    tensors: tuple[TensorStats, ...]

    @property
    def bytes_per_changed(self) -> float:
        return self.file_bytes / self.header.changed if self.header.changed else 0.0

    def render(self, limit: int = 50) -> str:
        """Human-readable report: header lines, then the tensors, largest first (`limit` 0: all)."""
        h = self.header
        lines = [
            f"codec         {printable(h.codec)}{'  (foreign TRL-layout file)' if h.foreign else ''}",
            f"version       {h.version}  (base {h.base_version})",
            (
                f"changed       {h.changed:,} of {h.total:,} elements ({100 * h.density:.4f}%)"
                if not h.foreign
                else f"changed       {h.changed:,} elements (the file does not say of how many)"
            ),
            f"file          {self.file_bytes:,} bytes, {self.bytes_per_changed:.3f} bytes per changed element",
            f"base hash     {printable(h.base_hash) or '-'}",
            f"target hash   {printable(h.target_hash) or '-'}",
            *(
                [f"checksum      sha256:{printable(h.checksum)} (TRL's, of the whole bf16 state after applying)"]
                if h.checksum
                else []
            ),
            "",
            f"{'tensor':<48} {'elements':>12} {'changed':>10} {'density':>9} {'form':>7} {'bytes':>10}",
        ]
        rows = sorted(self.tensors, key=lambda t: -t.bytes)
        for t in rows[: limit or None]:
            lines.append(
                f"{printable(t.name)[-48:]:<48} {t.elements:>12,} {t.changed:>10,} {100 * t.density:>8.3f}% "
                f"{printable(t.form):>7} {t.bytes:>10,}"
            )
        if limit and len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more tensors (--limit 0 lists all)")
        return "\n".join(lines)


def inspect_delta(data: bytes | memoryview, path: str | None = None) -> DeltaInfo:
    """Parse a delta and measure each tensor; every stream is decompressed and its length checked.

    Per-tensor bytes are exact for `raw`; for the compact codecs they are the tensor's own coded
    words plus its share of the tables (models, chunk index) by the share of words it holds.
    """
    header, blobs, codec = _read(data, path)
    try:
        sizes = codec.tensor_bytes(header.tensors, blobs)
    except DeltaFormatError as e:
        raise e.at(path) from None
    stats = tuple(
        TensorStats(
            e.name, e.numel if not header.foreign or e.form == "dense" else e.changed, e.changed, e.form, sizes[e.name]
        )
        for e in header.tensors
    )
    return DeltaInfo(header, len(data), stats)


def check_delta(
    data: bytes | memoryview, path: str | None = None, workers: int | None = None
) -> tuple[DeltaHeader, str]:
    """Check everything in a delta that can be checked without the state it applies to.

    Returns:
        (header, what was checked, in words: the header, the codec's streams, and what only the base can
        show). The header: every field's type and canonical form, names unique and sorted, counts within
        shapes, the streams the codec needs and no others; then the codec's own check (`Codec.check`:
        for `ctx` and `gap` every chunk's rANS words decoded).

    Raises:
        DeltaFormatError: the first thing found out of the format.
        IntegrityError: a TRL anchor that does not match its own checksum.
    """
    header, blobs, codec = _read(data, path)
    try:
        streams = codec.check(header.tensors, blobs, workers, foreign=header.foreign)
    except DeltaFormatError as e:
        raise e.at(path) from None
    if not header.foreign:
        kind = f"{header.codec} delta"
        needs = ("that each class rank exists in the old tensor, " if header.codec == "ctx" else "") + (
            "the base hash, the new values and the target hash"
        )
    elif all(e.form == "dense" for e in header.tensors):
        kind = "TRL anchor (its checksum_sha256, if it has one, matched its tensors)"
        needs = "that its tensors' names, shapes and dtypes are the base's"
    else:
        kind = "TRL patch" + (" with a checksum_sha256" if header.checksum else " (no hashes)")
        needs = "the tensors' names, dtypes and sizes" + (
            ", and the checksum of the state after applying" if header.checksum else ""
        )
    checked = (
        "the header (every field, names sorted and unique, counts, the streams it needs and no others)"
        if not header.foreign
        else "the metadata TRL writes (numbers in canonical form, counts and "
        "changed_params matching the tensors present)"
    )
    return header, f"well-formed {kind}. Checked: {checked}; {streams}. Needs --base: {needs}"


def _read(data: bytes | memoryview, path: str | None) -> tuple[DeltaHeader, dict, Codec]:
    """The delta's header, its streams and its codec (DeltaFormatError for a codec this reader lacks)."""
    header, blobs = read_delta(data, path)
    try:
        return header, blobs, get_codec(header.codec)
    except ValueError as e:
        raise DeltaFormatError(str(e), path=path) from e
