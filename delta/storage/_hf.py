"""A Hugging Face storage bucket (`hf://buckets/<namespace>/<name>`) through huggingface_hub's bucket API.

What was exercised here, without access to the Hub: URL parsing, and every call this backend makes,
run through the real huggingface_hub code (argument checks, URL building, its retry logic) up to the
point where the connection fails, which proves the arguments fit the installed huggingface_hub's
signatures and that a dead endpoint becomes `BucketUnreachableError`. Not exercised: anything the
Hub answers (file contents, listings, 401/403/404/5xx replies, partial batch failures), Xet
transfers, bucket creation, and huggingface_hub 1.x (the tests ran on the 2.x series).
"""

from __future__ import annotations

import functools
import importlib
import os
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import BucketUnreachableError, StorageError
from ..retry import RetryPolicy
from ._base import Failure, Storage, StoredFile, import_backend, install_hint

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
    """A Hugging Face storage bucket, thin over `HfApi`'s `create_bucket`, `batch_bucket_files`,
    `download_bucket_files` and `list_bucket_tree`.

    `HfFileSystem` is not used: it caches listings and bucket existence per instance, which a reader
    polling for new versions must not see stale, and it reads buckets only in releases after 1.5.

    Atomicity (as huggingface_hub documents it, not verified here): a write uploads the content to
    Xet storage first, then one batch call points the path at it, so a reader should see the old or
    the new file. A batch of several files is not transactional; `delete` is one batch.

    Blocking: each call blocks through huggingface_hub's own retries, so the default `retry` adds
    none. Reads download into a temporary directory that is removed before returning; a bounded read
    (`max_bytes`) asks the file's size first and downloads nothing past the bound (a file replaced
    between the two is caught on the local copy, read at most to the bound). Progress bars
    follow huggingface_hub's settings (HF_HUB_DISABLE_PROGRESS_BARS=1 hides them).

    Args:
        url: `hf://buckets/<namespace>/<name>` or `hf://buckets/<namespace>/<name>/<prefix>`.
        token: Hub token; default huggingface_hub's lookup (HF_TOKEN, then `hf auth login`'s file).
            Never logged nor put in messages.
        endpoint: Hub URL; default huggingface_hub's (HF_ENDPOINT, else huggingface.co).
        api: Your own `HfApi` instead of one built from `token` and `endpoint`.
        create: Create the bucket (if missing) before the first write.
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
        super().__init__(f"{_SCHEME}{self.bucket_id}/{self.prefix}".rstrip("/"), retry=retry or _DEFAULT_RETRY)
        if api is not None and (token is not None or endpoint is not None):
            raise ValueError("pass token and endpoint either to your HfApi or to HfBucketStorage, not both")
        if api is None:
            hub = import_backend("huggingface_hub", "hf://buckets/ URLs", "hf")
            if not hasattr(hub.HfApi, "batch_bucket_files"):
                raise ImportError(
                    f"huggingface_hub {hub.__version__} has no bucket API; hf://buckets/ URLs need >= 1.5: "
                    + install_hint("hf")
                )
            api = hub.HfApi(endpoint=endpoint, token=token)
        self._api = api
        self._create = create
        self._private = private

    def _classify(self, error: Exception) -> Failure | None:
        from huggingface_hub.errors import BucketNotFoundError, EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled

        if isinstance(error, (EntryNotFoundError, BucketNotFoundError)):
            return Failure(FileNotFoundError, str(error))
        if isinstance(error, OfflineModeIsEnabled):
            return Failure(StorageError, "HF_HUB_OFFLINE is set; unset it to reach the Hub")
        if isinstance(error, HfHubHTTPError):
            status = error.response.status_code if error.response is not None else None
            if status in (401, 403):
                return Failure(
                    StorageError,
                    f"the Hub refused the token (HTTP {status}); log in with `hf auth login` or set HF_TOKEN "
                    "to a token with write access to the bucket's namespace",
                )
            if status == 429 or (status or 0) >= 500:
                return Failure(BucketUnreachableError, f"the Hub answered HTTP {status}: {error}")
            return Failure(StorageError, f"the Hub answered: {error}")
        if isinstance(error, _transport_errors()):
            return Failure(BucketUnreachableError, f"cannot reach the Hub at {self._api.endpoint}: {error}")
        return None

    def _key(self, path: str) -> str:
        return self.prefix + path

    def _read(self, path: str, max_bytes: int | None) -> bytes:
        if max_bytes is not None:  # the size the Hub gives, before anything is downloaded
            size = self._api.get_bucket_file_metadata(self.bucket_id, self._key(path)).size
            if size > max_bytes:
                raise self._too_large(path, max_bytes, size)
        with tempfile.TemporaryDirectory(prefix="delta-hf-") as tmp:
            local = os.path.join(tmp, "file")
            self._api.download_bucket_files(self.bucket_id, [(self._key(path), local)], raise_on_missing_files=True)
            return self._read_local(local, path, max_bytes)  # replaced since: still bounded in memory

    def _write(self, path: str, data: bytes) -> None:
        if self._create:
            self._api.create_bucket(self.bucket_id, private=self._private, exist_ok=True)
            self._create = False  # once per instance; a race between threads only repeats an idempotent call
        self._api.batch_bucket_files(self.bucket_id, add=[(data, self._key(path))])

    def _move(self, source: str, target: str) -> None:
        # A copy by the content's Xet hash, made by the Hub (nothing downloaded), then the source deleted.
        xet_hash = self._api.get_bucket_file_metadata(self.bucket_id, self._key(source)).xet_file_data.file_hash
        self._api.batch_bucket_files(self.bucket_id, copy=[("bucket", self.bucket_id, xet_hash, self._key(target))])
        self._api.batch_bucket_files(self.bucket_id, delete=[self._key(source)])

    def _list(self, folder: str) -> Iterator[StoredFile]:
        # The Hub filters by string prefix; pass the folder without its '/' as huggingface_hub's sync does.
        prefix = self._key(folder).rstrip("/") or None
        for item in self._api.list_bucket_tree(self.bucket_id, prefix=prefix, recursive=True):
            if item.type == "file" and item.path.startswith(self.prefix):
                yield StoredFile(item.path[len(self.prefix) :], item.size)  # type: ignore[union-attr]  # a "file": BucketFile

    def _delete(self, paths: list[str]) -> None:
        self._api.batch_bucket_files(self.bucket_id, delete=[self._key(p) for p in paths])


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the Hub was not reached: httpx's (huggingface_hub 1.x) or httpx2's
    (2.x) transport errors, and the builtin ones hf_xet raises for its own transfers."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except ImportError:
            continue  # the other huggingface_hub generation's HTTP client
    return tuple(errors)
