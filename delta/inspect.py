"""What a delta file holds, per tensor, without the state it applies to."""

from __future__ import annotations

from dataclasses import dataclass

from .codecs import get_codec
from .errors import DeltaFormatError
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
            f"codec         {h.codec}{'  (foreign TRL-layout file)' if h.foreign else ''}",
            f"version       {h.version}  (base {h.base_version})",
            f"changed       {h.changed:,} of {h.total:,} elements ({100 * h.density:.4f}%)",
            f"file          {self.file_bytes:,} bytes, {self.bytes_per_changed:.3f} bytes per changed element",
            f"base hash     {h.base_hash or '-'}",
            f"target hash   {h.target_hash or '-'}",
            "",
            f"{'tensor':<48} {'elements':>12} {'changed':>10} {'density':>9} {'form':>7} {'bytes':>10}",
        ]
        rows = sorted(self.tensors, key=lambda t: -t.bytes)
        for t in rows[:limit or None]:
            lines.append(f"{_printable(t.name)[-48:]:<48} {t.elements:>12,} {t.changed:>10,} {100 * t.density:>8.3f}% "
                         f"{t.form:>7} {t.bytes:>10,}")
        if limit and len(rows) > limit:
            lines.append(f"... {len(rows) - limit} more tensors (--limit 0 lists all)")
        return "\n".join(lines)


def _printable(name: str) -> str:
    """`name` with control and other unprintable characters escaped: a terminal shows them, never runs them."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in name)


def inspect_delta(data: bytes | memoryview, path: str | None = None) -> DeltaInfo:
    """Parse a delta and measure each tensor; every stream is decompressed and its length checked.

    Per-tensor bytes are exact for `raw`; for the compact codecs they are the tensor's own coded
    words plus its share of the tables (models, chunk index) by the share of words it holds.
    """
    header, blobs = read_delta(data, path)
    try:
        codec = get_codec(header.codec)
    except ValueError as e:
        raise DeltaFormatError(str(e), path=path) from e
    sizes = codec.tensor_bytes(header.tensors, blobs)
    stats = tuple(TensorStats(e.name, e.numel if not header.foreign else blobs[f"{e.name}.indices"].numel(),
                              e.changed, e.form, sizes[e.name]) for e in header.tensors)
    return DeltaInfo(header, len(data), stats)
