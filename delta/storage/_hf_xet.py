"""File contents to and from a Hub bucket through Xet storage, with the Xet token kept between transfers.

What `HfApi.batch_bucket_files(add=...)` and `HfApi.download_bucket_files` do inside, less what a bucket that is
read and written every few seconds cannot afford: there, hf_xet fetches a fresh Xet token from the Hub for every
transfer (an API-class request each), and a download asks for the file's metadata twice more (paths-info, then a HEAD
for the token's route). Here the token comes from huggingface_hub's own cache of them (`_fetch_xet_connection_info_with_
url`: one request per token lifetime, per bucket, token and scope) and is handed to hf_xet with its expiry, hf_xet
keeping the route to refresh it should a long transfer outlive it; a download takes the file's Xet hash and size from
the caller (a listing, or one paths-info).

It leans on huggingface_hub's private `utils._xet` helpers and `_buckets._BucketAddFile` (what its own bucket calls
use), checked against huggingface_hub 2.4 by the storage suite against the local Hub (tests/test_storage.py);
requirements.txt bounds huggingface_hub below 3. hf_xet's failures leave as `XetTransferError`, so `_hf_errors`
knows where a builtin error came from.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ._traffic import Traffic

T = TypeVar("T")


class XetTransferError(Exception):
    """hf_xet failed a transfer (its builtin `ConnectionError`, `RuntimeError`, `PermissionError`, ...), wrapped to
    say where it came from.

    Attributes:
        cause: What hf_xet raised.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


@dataclass(frozen=True)
class XetTarget:
    """One bucket on one Hub, as Xet transfers need it.

    Attributes:
        endpoint: The Hub's URL.
        bucket_id: `namespace/name`.
        headers: The Hub request headers huggingface_hub builds for the token (authorization included).
    """

    endpoint: str
    bucket_id: str
    headers: dict[str, str]

    def refresh_url(self, scope: str) -> str:
        """The Hub route that hands out a Xet token of `scope` ("read" or "write") for this bucket."""
        from huggingface_hub.utils._xet import XetTokenType, xet_connection_info_refresh_url

        return xet_connection_info_refresh_url(
            token_type=XetTokenType(scope), repo_id=self.bucket_id, repo_type="bucket", endpoint=self.endpoint
        )

    def session_options(self, scope: str) -> dict[str, Any]:
        """What hf_xet's upload commit or download group is opened with: the kept token of `scope` (fetched when there
        is none still valid for a minute), its expiry, and the route to refresh it."""
        from huggingface_hub.utils._xet import _fetch_xet_connection_info_with_url, xet_headers_without_auth

        url = self.refresh_url(scope)
        info = _fetch_xet_connection_info_with_url(url, self.headers)  # cached until a minute before it expires
        return {
            "endpoint": info.endpoint,
            "token": info.access_token,
            "token_expiry_unix_secs": info.expiration_unix_epoch,
            "token_refresh_url": url,
            "token_refresh_headers": self.headers,
            "custom_headers": xet_headers_without_auth(self.headers),
        }

    def forget_token(self, scope: str) -> None:
        """Drop the kept token of `scope` (Xet storage refused it), so the next transfer fetches a fresh one."""
        from huggingface_hub.utils import _xet

        _xet.XET_CONNECTION_INFO_CACHE.pop(_xet._cache_key(self.refresh_url(scope), self.headers), None)


def upload(target: XetTarget, data: bytes, traffic: Traffic) -> tuple[str, int]:
    """Store `data` in Xet storage; return its Xet hash and size, for a batch call to point a path at."""
    from hf_xet import SKIP_SHA256
    from huggingface_hub.utils._xet import get_xet_session

    def send(options: dict[str, Any]) -> tuple[str, int]:
        with get_xet_session().new_upload_commit(**options) as commit:
            handle = commit.start_upload_bytes(data, sha256=SKIP_SHA256)
        info = handle.result().xet_info
        return info.hash, info.file_size

    return _with_token(target, "write", traffic, send)


def download(
    target: XetTarget, xet_hash: str, size: int, destination: str | os.PathLike[str], traffic: Traffic
) -> None:
    """Write the content named by `xet_hash` (of `size` bytes) to the file `destination`."""
    from hf_xet import XetFileInfo
    from huggingface_hub.utils._xet import get_xet_session

    if size == 0:  # nothing to fetch (huggingface_hub skips these too)
        open(destination, "wb").close()
        return

    def fetch(options: dict[str, Any]) -> None:
        with get_xet_session().new_file_download_group(**options) as group:
            group.start_download_file(XetFileInfo(xet_hash, size), str(destination))

    _with_token(target, "read", traffic, fetch)


def _with_token(target: XetTarget, scope: str, traffic: Traffic, transfer: Callable[[dict[str, Any]], T]) -> T:
    """Run `transfer` with the kept Xet token of `scope`; once more with a fresh one if Xet storage refuses the kept
    one (HTTP 401: expired early, or revoked by the Hub), as hf_xet does not. hf_xet's failures leave wrapped."""
    for attempt in (1, 2):
        options = target.session_options(scope)
        traffic.count("transfer")
        try:
            return transfer(options)
        except Exception as error:  # hf_xet raises builtins for what the Hub and Xet storage answered
            if attempt == 1 and _refused_token(error):
                target.forget_token(scope)
                continue
            raise XetTransferError(error) from error
    raise AssertionError("unreachable")


def _refused_token(error: BaseException) -> bool:
    import hf_xet

    return isinstance(error, hf_xet.XetAuthenticationError) or re.search(r"\b401\b", str(error)) is not None


def add_operation(data: bytes, path: str, xet_hash: str, size: int) -> Any:
    """A batch call's `add` entry for content uploaded already (huggingface_hub then uploads nothing)."""
    from huggingface_hub._buckets import _BucketAddFile

    return _BucketAddFile(source=data, destination=path, xet_hash=xet_hash, size=size)
