"""How a bucket's paths become the Hub's JSON: file and folder entries, tree listings and their pages.

From huggingface_hub's code: entries are `{"type": "file", "path", "size", "xetHash", "mtime", "uploadedAt"}` or
`{"type": "directory", "path", "uploadedAt"}` with times as `2024-09-25T15:31:02.346Z`; `prefix` matches paths
lexically ("logs" also lists "logs_old/x", as `HfFileSystem` notes); a recursive listing holds files only and a
non-recursive one files and folders ("If recursive=False, both files and folders are returned by the server").
Inferred: a non-recursive listing shows one level below the prefix taken as a folder (`a` and `a/` list `a/*`'s
first level; the bucket root lists the first level), and pages are cut in path order with the last path of a page
as the cursor of the next.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from .store import Bucket, BucketFile


def iso(epoch_s: float) -> str:
    """`2024-09-25T15:31:02.346Z`, the form `huggingface_hub.utils.parse_datetime` reads."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def file_entry(path: str, file: BucketFile) -> dict[str, Any]:
    return {
        "type": "file",
        "path": path,
        "size": file.size,
        "xetHash": file.xet_hash,
        "mtime": iso(file.mtime_ms / 1000),
        "uploadedAt": iso(file.uploaded_at),
    }


def bucket_info(bucket: Bucket) -> dict[str, Any]:
    """`BucketInfo`'s fields: id, private, createdAt, size, totalFiles; and `updatedAt`, which huggingface_hub's
    events client reads to resume from (`BucketFollower._fetch_updated_at`): here the last batch that changed a path."""
    return {
        "id": bucket.id,
        "private": bucket.private,
        "createdAt": iso(bucket.created_at),
        "updatedAt": iso(bucket.updated_at),
        "size": sum(f.size for f in bucket.files.values()),
        "totalFiles": len(bucket.files),
    }


def tree_entries(bucket: Bucket, prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """Every entry of a listing, sorted by path (see the module docstring for what is inferred)."""
    matching = sorted((p, f) for p, f in bucket.files.items() if p.startswith(prefix))
    if recursive:
        return [file_entry(p, f) for p, f in matching]
    folder = prefix.rstrip("/")
    depth = folder.count("/") + 2 if folder else 1  # path components of an entry one level below the prefix
    files: dict[str, dict[str, Any]] = {}
    folders: dict[str, float] = {}
    for path, file in matching:
        parts = path.split("/")
        if len(parts) <= depth:
            files[path] = file_entry(path, file)
        else:
            name = "/".join(parts[:depth])
            folders[name] = max(folders.get(name, 0.0), file.uploaded_at)
    entries = list(files.values()) + [
        {"type": "directory", "path": name, "uploadedAt": iso(at)} for name, at in folders.items()
    ]
    return sorted(entries, key=lambda entry: entry["path"])


def page_after(entries: list[dict[str, Any]], cursor: str | None, size: int) -> tuple[list[dict[str, Any]], str | None]:
    """The page of `entries` (sorted by path) after `cursor`, and the cursor of the next page (None at the end)."""
    start = 0
    if cursor is not None:
        start = next((i for i, e in enumerate(entries) if e["path"] > cursor), len(entries))
    page = entries[start : start + size]
    more = start + size < len(entries)
    return page, (page[-1]["path"] if more and page else None)
