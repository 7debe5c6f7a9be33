"""Buckets: one small interface over a local directory, S3 and Hugging Face storage buckets.

    >>> from delta.storage import open_storage
    >>> storage = open_storage("./bucket")          # or s3://name/prefix, hf://buckets/ns/name/prefix
    >>> storage.write("versions/00000001.json", b"{}")
    >>> [f.path for f in storage.list("versions/")]
    ['versions/00000001.json']
    >>> storage.read("versions/00000001.json", max_bytes=1 << 20)   # a stranger's file: bounded
    b'{}'

The primitives only: what a process keeps about a bucket (its shared listing, budget, keys, trust and resume) is
`delta.Bucket`'s, which opens its storage with `open_storage` and passes it its `Traffic`. Backends' libraries (s3fs,
huggingface_hub) are imported only when a bucket of theirs is opened.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import (
    AccessDeniedError,
    BucketNotFoundError,
    BucketUnreachableError,
    FileTooLargeError,
    RateLimitedError,
    StorageError,
)
from ..retry import RetryPolicy
from ._base import Storage, StoredFile, check_path
from ._fsspec import S3Storage
from ._hf import HfBucketStorage
from ._local import LocalStorage
from ._traffic import RateLimit, Traffic, TrafficSnapshot

__all__ = [
    "AccessDeniedError",
    "BucketNotFoundError",
    "BucketUnreachableError",
    "FileTooLargeError",
    "HfBucketStorage",
    "LocalStorage",
    "RateLimit",
    "RateLimitedError",
    "RetryPolicy",
    "S3Storage",
    "Storage",
    "StorageError",
    "StoredFile",
    "Traffic",
    "TrafficSnapshot",
    "check_path",
    "open_storage",
]

URL_FORMS = "a directory path, file:///abs/path, s3://bucket[/prefix] or hf://buckets/<namespace>/<name>[/prefix]"


def open_storage(url: str | os.PathLike[str], **options: Any) -> Storage:
    """Open the bucket at `url`, choosing the backend by its scheme. Makes no network call.

    Args:
        url: A local directory (a plain path or `file:///abs/path`; created if missing),
            `s3://bucket[/prefix]` (S3 or S3-compatible, see `S3Storage`) or
            `hf://buckets/<namespace>/<name>[/prefix]` (Hugging Face, see `HfBucketStorage`).
        **options: Passed to the backend: `retry` and `traffic` for all; `endpoint_url`, `key`, `secret`, `timeout`
            for S3; `token`, `endpoint`, `api`, `create`, `private` for Hugging Face.

    Raises:
        ValueError: An unknown scheme or a malformed URL.
        ImportError: The backend's library is not installed (the message says how to install it).
    """
    url = os.fspath(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return LocalStorage(url, **options)
    if scheme == "file":
        return LocalStorage(rest, **options)
    if scheme == "s3":
        return S3Storage(url, **options)
    if scheme == "hf":
        return HfBucketStorage(url, **options)
    raise ValueError(f"unsupported bucket URL {url!r}: use {URL_FORMS}")
