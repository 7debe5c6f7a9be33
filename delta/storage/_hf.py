"""A Hugging Face storage bucket (`hf://buckets/<namespace>/<name>`) through the Hub's bucket API and hf_xet.

Exercised against a local Hub built from the clients' own code and xet-core's protocol (tests/local_hub, docs/
local-hub.md) with the real huggingface_hub 2.x and hf_xet: every call, its failures (refused tokens, missing and
private buckets, 429s, 5xx, dropped connections, failed batch entries, expired Xet tokens) and its request counts. Not
against the Hub itself.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..retry import RetryPolicy
from ._base import Failure, Storage, StoredFile, import_backend, install_hint
from ._hf_errors import HubCall, classify
from ._hf_xet import download, upload
from ._hub_api import HubApi
from ._traffic import Traffic

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_SCHEME = "hf://buckets/"


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
    """A Hugging Face storage bucket: metadata through the Hub's bucket routes (`_hub_api.HubApi`, this storage's own
    client), contents through hf_xet with the Xet token kept between transfers (`_hf_xet`).

    Requests (counted in `traffic` by the Hub's classes): a listing is one API request per page; a read one paths-info
    (none given a listed entry) and its transfer; a write one batch call and its transfer (`write_many`: one batch for
    all); a move a paths-info and two batch calls; a delete one batch call; a Xet token one per token lifetime.

    Atomicity (as huggingface_hub documents it): content first to Xet storage, then one batch call points the path at
    it, so a reader sees the old or the new file; a batch of several files is not transactional. A bounded read learns
    the file's size first and downloads nothing past the bound.

    Args:
        url: `hf://buckets/<namespace>/<name>[/<prefix>]`.
        token: Hub token; default huggingface_hub's lookup (HF_TOKEN, then `hf auth login`'s file). Never logged.
        endpoint: Hub URL; default huggingface_hub's (HF_ENDPOINT, else huggingface.co).
        api: An `HfApi` whose endpoint, token and headers to use, instead of `token` and `endpoint`.
        create: Create the bucket (if missing) before the first write; else such a write raises `BucketNotFoundError`.
        private: Visibility of a bucket this creates; default the namespace's default.
        retry: How calls are retried while the Hub does not answer.
        traffic: Where requests are counted (None: a `Traffic` of its own).
    """

    CLASSES = ("api", "resolver", "transfer")

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
        traffic: Traffic | None = None,
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

        super().__init__(f"{_SCHEME}{self.bucket_id}/{self.prefix}".rstrip("/"), retry=retry, traffic=traffic)
        headers = build_hf_headers(token=api.token, headers=api.headers)
        self._hub = HubApi(api.endpoint, self.bucket_id, headers, self.traffic)
        has_token = any(k.lower() == "authorization" for k in headers)
        self._call_read = HubCall(api.endpoint, self.bucket_id, has_token, writing=False)
        self._call_write = HubCall(api.endpoint, self.bucket_id, has_token, writing=True)
        self._identity = f"{self.url} at {api.endpoint.rstrip('/')}"
        self._create = create
        self._private = private
        self._writing = threading.local()  # the call in progress writes: its refusals say "needs write access"

    @property
    def identity(self) -> str:
        """The namespace, name and prefix, with the Hub endpoint that serves them."""
        return self._identity

    def _call(self, operation: str, path: str | None, call: Any) -> Any:
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
            download(self._hub, xet_hash, size, local)
            return self._read_local(local, path, max_bytes)  # still bounded in memory, whatever came

    def _info(self, path: str) -> tuple[str, int]:
        """The Xet hash and size of `path` (one paths-info request)."""
        for info in self._hub.paths_info([self._key(path)]):
            if info.get("path") == self._key(path) and info.get("type", "file") == "file":
                return info["xetHash"], int(info["size"])
        raise FileNotFoundError(path)

    def _write(self, path: str, data: bytes) -> str | None:
        return self._write_many([(path, data)])[0]

    def _write_many(self, files: list[tuple[str, bytes]]) -> list[str | None]:
        # Each content to Xet storage first, then one batch call points every path at its content.
        if self._create:
            self._hub.create(self._private)
            self._create = False  # once per instance; a race between threads only repeats an idempotent call
        stored = [(path, *upload(self._hub, data)) for path, data in files]
        self._hub.batch([_add(self._key(path), xet_hash) for path, xet_hash, _ in stored])
        return [xet_hash for _, xet_hash, _ in stored]

    def _move(self, source: str, target: str) -> None:
        # A copy by the content's Xet hash, made by the Hub (nothing downloaded), then the source deleted: two calls,
        # so that a failed copy never leaves the source deleted.
        xet_hash, _ = self._info(source)
        copy = {**_add(self._key(target), xet_hash), "type": "copyFile"}
        self._hub.batch([{**copy, "sourceRepoType": "bucket", "sourceRepoId": self.bucket_id}])
        self._hub.batch([{"type": "deleteFile", "path": self._key(source)}])

    def _list(self, folder: str) -> Iterator[StoredFile]:
        # The Hub filters by string prefix; pass the folder without its '/' as huggingface_hub's sync does.
        for item in self._hub.tree(self._key(folder).rstrip("/") or None):
            path = item.get("path", "")
            if item.get("type") == "file" and path.startswith(self.prefix):
                yield StoredFile(path[len(self.prefix) :], int(item["size"]), item.get("xetHash"))

    def _delete(self, paths: list[str]) -> None:
        self._hub.batch([{"type": "deleteFile", "path": self._key(p)} for p in paths])


def _add(path: str, xet_hash: str) -> dict[str, Any]:
    """A batch call's `addFile` line for content already in Xet storage (as huggingface_hub writes it)."""
    return {"type": "addFile", "path": path, "xetHash": xet_hash, "mtime": int(time.time() * 1000)}
