"""A Hugging Face storage bucket (`hf://buckets/<namespace>/<name>`) through huggingface_hub's bucket API and hf_xet.

Exercised against a local Hub built from the clients' own code and xet-core's protocol (tests/local_hub, docs/
local-hub.md) with the real huggingface_hub 2.x and hf_xet: every call, its failures (refused tokens, missing and
private buckets, 429s, 5xx, dropped connections, failed batch entries, expired Xet tokens) and its request counts. Not
against the Hub itself.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from ..retry import RetryPolicy
from ._base import Failure, Storage, import_backend, install_hint
from ._hf_errors import HubCall, classify
from ._hf_http import counting
from ._hf_xet import XetTarget, add_operation, download, upload
from ._listing import StoredFile
from ._traffic import shared_traffic

T = TypeVar("T")

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_SCHEME = "hf://buckets/"

# huggingface_hub backs off on its own (about 24 s over 5 retries for HTTP calls, longer for Xet
# transfers); a second loop of ours on top would multiply the wait.
_DEFAULT_RETRY = RetryPolicy(attempts=1)


def parse_hf_bucket_url(url: str) -> tuple[str, str]:
    """Split `hf://buckets/<namespace>/<name>[/prefix]` into the bucket id (`namespace/name`) and the
    prefix ('' or ending with '/').

    Raises:
        ValueError: Not a bucket URL (model, dataset and Space repositories are not buckets).
    """
    if not url.startswith(_SCHEME):
        raise ValueError(
            f"not a Hugging Face bucket URL: {url!r}; expected hf://buckets/<namespace>/<name>[/prefix] "
            "(model, dataset and Space repositories cannot be used as buckets)"
        )
    parts = url[len(_SCHEME) :].strip("/").split("/", 2)
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise ValueError(f"no bucket name in {url!r}; expected hf://buckets/<namespace>/<name>[/prefix]")
    return f"{parts[0]}/{parts[1]}", parts[2] + "/" if len(parts) == 3 else ""


class HfBucketStorage(Storage):
    """A Hugging Face storage bucket: metadata through `HfApi` (`list_bucket_tree`, `get_bucket_paths_info`,
    `batch_bucket_files`, `create_bucket`), contents through hf_xet with the Xet token kept between transfers
    (`_hf_xet`).

    `HfFileSystem` is not used: it caches listings and bucket existence per instance, which a reader polling for new
    versions must not see stale.

    Requests (the Hub counts them per account in 5-minute windows; `traffic` counts them here): a listing is one API
    request per page; a read one paths-info (none when given the entry a listing returned) and its transfer; a write
    one batch call and its transfer (`write_many`: one batch call for all its files); a move one paths-info and two
    batch calls; a delete one batch call; a Xet token one API request per token lifetime, shared by every storage of
    the process with the same token. A 429 holds every storage of the process with the same token back until the
    time the Hub named (`RateLimitedError`).

    Atomicity (as huggingface_hub documents it): a write stores the content in Xet storage first, then one batch
    call points the path at it, so a reader sees the old or the new file. A batch of several files is not
    transactional; `delete` is one batch.

    Blocking: each call blocks through huggingface_hub's and hf_xet's own retries of 5xx answers and dropped
    connections, so the default `retry` adds none. Reads download into a temporary directory that is removed before
    returning; a bounded read (`max_bytes`) learns the file's size first and downloads nothing past the bound.

    Args:
        url: `hf://buckets/<namespace>/<name>` or `hf://buckets/<namespace>/<name>/<prefix>`.
        token: Hub token; default huggingface_hub's lookup (HF_TOKEN, then `hf auth login`'s file).
            Never logged nor put in messages.
        endpoint: Hub URL; default huggingface_hub's (HF_ENDPOINT, else huggingface.co).
        api: Your own `HfApi` instead of one built from `token` and `endpoint`.
        create: Create the bucket (if missing) before the first write; else a write to a missing bucket raises
            `BucketNotFoundError`.
        private: Visibility of a bucket this creates; default the namespace's default.
        retry: How calls are retried on top of huggingface_hub's own retries.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | bool | None = None,
        endpoint: str | None = None,
        api: HfApi | None = None,
        create: bool = True,
        private: bool | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.bucket_id, self.prefix = parse_hf_bucket_url(url)
        if api is not None and (token is not None or endpoint is not None):
            raise ValueError("pass token and endpoint either to your HfApi or to HfBucketStorage, not both")
        if api is None:
            hub = import_backend("huggingface_hub", "hf://buckets/ URLs", "hf")
            if int(hub.__version__.split(".")[0]) < 2:
                raise ImportError(
                    f"hf://buckets/ URLs need huggingface_hub >= 2 (installed: {hub.__version__}): "
                    + install_hint("hf")
                )
            api = hub.HfApi(endpoint=endpoint, token=token)
        from huggingface_hub.utils import build_hf_headers

        self._api = api
        headers = build_hf_headers(token=api.token, headers=api.headers)
        self._xet = XetTarget(api.endpoint, self.bucket_id, headers)
        has_token = any(k.lower() == "authorization" for k in headers)
        self._call_read = HubCall(api.endpoint, self.bucket_id, has_token, writing=False)
        self._call_write = HubCall(api.endpoint, self.bucket_id, has_token, writing=True)
        account = hashlib.sha256(next((v for k, v in headers.items() if k.lower() == "authorization"), "").encode())
        traffic = shared_traffic(("hf", api.endpoint, account.hexdigest()), ("api", "resolver", "transfer"))
        super().__init__(
            f"{_SCHEME}{self.bucket_id}/{self.prefix}".rstrip("/"), retry=retry or _DEFAULT_RETRY, traffic=traffic
        )
        self._create = create
        self._private = private
        self._writing = threading.local()  # the call in progress writes: its refusals say "needs write access"

    def _call(self, operation: str, path: str | None, call: Callable[[], T]) -> T:
        with counting(self.traffic):
            self._writing.value = operation in ("write", "move", "delete")
            return super()._call(operation, path, call)

    def _classify(self, error: Exception) -> Failure | None:
        return classify(error, self._call_write if getattr(self._writing, "value", False) else self._call_read)

    def _key(self, path: str) -> str:
        return self.prefix + path

    def _read(self, path: str, max_bytes: int | None, listed: StoredFile | None) -> bytes:
        if listed is not None and listed.etag is not None:
            xet_hash, size = listed.etag, listed.size
        else:
            xet_hash, size = self._info(path)
        if max_bytes is not None and size > max_bytes:  # the size the Hub gives, before anything is downloaded
            raise self._too_large(path, max_bytes, size)
        with tempfile.TemporaryDirectory(prefix="delta-hf-") as tmp:
            local = os.path.join(tmp, "file")
            download(self._xet, xet_hash, size, local, self.traffic)
            return self._read_local(local, path, max_bytes)  # still bounded in memory, whatever came

    def _info(self, path: str) -> tuple[str, int]:
        """The Xet hash and size of `path` (one paths-info request)."""
        for info in self._api.get_bucket_paths_info(self.bucket_id, [self._key(path)]):
            if info.path == self._key(path):
                return info.xet_hash, info.size
        raise FileNotFoundError(path)

    def _write(self, path: str, data: bytes) -> str | None:
        return self._write_many([(path, data)])[0]

    def _write_many(self, files: list[tuple[str, bytes]]) -> list[str | None]:
        # Each content to Xet storage first, then one batch call points every path at its content.
        if self._create:
            self._api.create_bucket(self.bucket_id, private=self._private, exist_ok=True)
            self._create = False  # once per instance; a race between threads only repeats an idempotent call
        stored = [(path, data, *upload(self._xet, data, self.traffic)) for path, data in files]
        add = [add_operation(data, self._key(path), xet_hash, size) for path, data, xet_hash, size in stored]
        self._api.batch_bucket_files(self.bucket_id, add=add)
        return [xet_hash for _, _, xet_hash, _ in stored]

    def _move(self, source: str, target: str) -> None:
        # A copy by the content's Xet hash, made by the Hub (nothing downloaded), then the source deleted: two calls,
        # so that a failed copy never leaves the source deleted.
        xet_hash, _ = self._info(source)
        self._api.batch_bucket_files(self.bucket_id, copy=[("bucket", self.bucket_id, xet_hash, self._key(target))])
        self._api.batch_bucket_files(self.bucket_id, delete=[self._key(source)])

    def _list(self, folder: str) -> Iterator[StoredFile]:
        # The Hub filters by string prefix; pass the folder without its '/' as huggingface_hub's sync does.
        prefix = self._key(folder).rstrip("/") or None
        for item in self._api.list_bucket_tree(self.bucket_id, prefix=prefix, recursive=True):
            if item.type == "file" and item.path.startswith(self.prefix):
                yield StoredFile(item.path[len(self.prefix) :], item.size, item.xet_hash)  # type: ignore[union-attr]  # a "file": BucketFile

    def _delete(self, paths: list[str]) -> None:
        self._api.batch_bucket_files(self.bucket_id, delete=[self._key(p) for p in paths])
