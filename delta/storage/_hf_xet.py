"""File contents to and from a Hub bucket through Xet storage, with the Xet token kept between transfers.

What `HfApi.batch_bucket_files(add=...)` and `HfApi.download_bucket_files` do inside, less what a bucket read and
written every few seconds cannot afford: hf_xet would fetch a fresh Xet token for every transfer (an API-class request
each), and a download would ask for the file's metadata twice more. Here the token comes from the storage's own
client (`_hub_api.HubApi.xet_token`: one request per token lifetime) and is handed to hf_xet with its expiry and the
route to refresh it; a download takes the file's Xet hash and size from the caller (a listing, or one paths-info).
It leans on huggingface_hub's `get_xet_session` and `xet_headers_without_auth` (checked against huggingface_hub 2.4
by tests/test_storage.py; requirements.txt bounds it below 3). hf_xet's failures leave as `XetTransferError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

from ._hub_api import HubApi

T = TypeVar("T")


class XetTransferError(Exception):
    """hf_xet failed a transfer (its builtin `ConnectionError`, `RuntimeError`, ...), wrapped to say where it came from.

    Attributes:
        cause: What hf_xet raised.
    """

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


def upload(hub: HubApi, data: bytes) -> tuple[str, int]:
    """Store `data` in Xet storage; return its Xet hash and size, for a batch call to point a path at."""
    from hf_xet import SKIP_SHA256
    from huggingface_hub.utils._xet import get_xet_session

    def send(options: dict[str, Any]) -> tuple[str, int]:
        with get_xet_session().new_upload_commit(**options) as commit:
            handle = commit.start_upload_bytes(data, sha256=SKIP_SHA256)
        info = handle.result().xet_info
        return info.hash, info.file_size

    return _with_token(hub, "write", send)


def download(hub: HubApi, xet_hash: str, size: int, destination: str | os.PathLike[str]) -> None:
    """Write the content named by `xet_hash` (of `size` bytes) to the file `destination`."""
    from hf_xet import XetFileInfo
    from huggingface_hub.utils._xet import get_xet_session

    if size == 0:  # nothing to fetch (huggingface_hub skips these too)
        open(destination, "wb").close()
        return

    def fetch(options: dict[str, Any]) -> None:
        with get_xet_session().new_file_download_group(**options) as group:
            group.start_download_file(XetFileInfo(xet_hash, size), str(destination))

    _with_token(hub, "read", fetch)


def _with_token(hub: HubApi, scope: str, transfer: Callable[[dict[str, Any]], T]) -> T:
    """Run `transfer` with the kept Xet token of `scope`; once more with a fresh one if Xet storage refuses it (HTTP
    401: expired early, or revoked), as hf_xet does not. hf_xet's failures leave wrapped."""
    from huggingface_hub.utils._xet import xet_headers_without_auth

    for attempt in (1, 2):
        info = hub.xet_token(scope)
        options = {
            "endpoint": info.endpoint,
            "token": info.access_token,
            "token_expiry_unix_secs": info.expiration_unix_epoch,
            "token_refresh_url": hub.token_url(scope),
            "token_refresh_headers": hub.headers,
            "custom_headers": xet_headers_without_auth(hub.headers),
        }
        hub.traffic.count("transfer")
        try:
            return transfer(options)
        except Exception as error:  # hf_xet raises builtins for what the Hub and Xet storage answered
            if attempt == 1 and _refused_token(error):
                hub.forget_token(scope)
                continue
            raise XetTransferError(error) from error
    raise AssertionError("unreachable")


def _refused_token(error: BaseException) -> bool:
    import hf_xet

    return isinstance(error, hf_xet.XetAuthenticationError) or re.search(r"\b401\b", str(error)) is not None
