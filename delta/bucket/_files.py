"""What the bucket layer's modules (manifest, reader, retention, ranks) need of a bucket: `delta.Bucket` is one.

A protocol, so that those modules sit below `handle.py` (which builds on them for the resume) without an import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from ..storage import StoredFile

T = TypeVar("T")


class Files(Protocol):
    """A bucket's files as one process shares them (see `delta.Bucket` for each method)."""

    @property
    def url(self) -> str: ...

    def read(self, path: str, max_bytes: int | None = None, *, listed: StoredFile | None = None) -> bytes: ...

    def write(self, path: str, data: bytes) -> StoredFile: ...

    def list(self, prefix: str = "", *, max_age: float = 0.0) -> list[StoredFile]: ...

    def listed(self, path: str) -> StoredFile | None: ...

    def delete(self, paths: Iterable[str]) -> None: ...

    def parsed(self, listed: StoredFile, read: Callable[[], T], refusals: tuple[type[Exception], ...] = ()) -> T: ...
