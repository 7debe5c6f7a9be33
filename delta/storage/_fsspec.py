"""A bucket on S3 or any S3-compatible server (MinIO, R2, `rclone serve s3`, ...) through fsspec/s3fs."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..errors import AccessDeniedError, BucketNotFoundError, BucketUnreachableError, StorageError
from ..retry import RetryPolicy
from ._base import Failure, Storage, StoredFile, import_backend
from ._traffic import Traffic

T = TypeVar("T")

# A write may take `timeout` plus one second per MiB before it is abandoned (see S3Storage).
_MIN_UPLOAD_BYTES_PER_S = 2**20
# Bytes asked of a response body at a time by a bounded read.
_READ_PIECE = 1 << 20


def _endpoint_from_env() -> str | None:
    """The S3 endpoint named by the environment, as the AWS tools read it (service-specific first).

    The only environment read of this backend; credentials, region and profiles are left to
    botocore's own lookup (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ~/.aws, roles).
    """
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split `s3://bucket[/prefix]` into the bucket name and the prefix ('' or ending with '/').

    Raises:
        ValueError: Not an s3:// URL, or no bucket name.
    """
    if not url.startswith("s3://"):
        raise ValueError(f"not an S3 URL: {url!r}; expected s3://bucket[/prefix]")
    bucket, _, prefix = url[len("s3://") :].strip("/").partition("/")
    if not bucket:
        raise ValueError(f"no bucket name in {url!r}; expected s3://bucket[/prefix]")
    return bucket, prefix + "/" if prefix else ""


class S3Storage(Storage):
    """`s3://bucket[/prefix]` through s3fs. The bucket is created on the first write if missing.

    Atomicity: a write is one PUT (multipart above 100 MiB) and a read one GET (a bounded read: one GET of the first
    bytes), so a reader sees the old or the new content where the server promises it; `rclone serve s3` keeps it only in
    part (a read during an overwrite may come back short: the length check catches it). `delete` sends one request per
    1000 paths, and s3fs ignores per-key errors in its reply.

    Blocking: `timeout` bounds connecting and each wait for data; uploads go without "Expect: 100-continue" (which
    aiohttp waits for without a timeout), and a write has a deadline of `timeout` plus a second per MiB. Retries are
    `retry`'s alone (s3fs's and botocore's are off). Open it in the process that uses it: s3fs refuses an instance
    from before a fork.

    Args:
        url: `s3://bucket` or `s3://bucket/prefix`.
        endpoint_url: Server URL for S3-compatible stores; default AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, else AWS.
        key, secret: Credentials; default botocore's lookup (environment, ~/.aws, instance role).
        timeout: Seconds to wait for a connection or for data before an attempt fails.
        retry: How calls are retried while the server does not answer.
        traffic: Where requests are counted, by how S3 bills them (None: a `Traffic` of its own).
    """

    CLASSES = ("put", "get", "delete")

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        traffic: Traffic | None = None,
    ) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.endpoint_url = endpoint_url or _endpoint_from_env()
        super().__init__(f"s3://{self.bucket}/{self.prefix}".rstrip("/"), retry=retry, traffic=traffic)
        self.timeout = timeout
        self._identity = f"{self.url} at {(self.endpoint_url or 'AWS S3').rstrip('/')}"
        s3fs = import_backend("s3fs", "s3:// URLs", "s3")
        session = import_backend("aiobotocore.session", "s3:// URLs", "s3").AioSession()
        # Runs after botocore's own handler for the same event, which adds the header to every upload.
        session.register("before-call.s3", _drop_expect_continue)
        session.register("before-send.s3", self._count)
        self._fs = s3fs.S3FileSystem(
            key=key,
            secret=secret,
            endpoint_url=self.endpoint_url,
            session=session,
            skip_instance_cache=True,  # our own settings, never another caller's instance
            use_listings_cache=False,  # a poller must see new files at once
            config_kwargs={
                "connect_timeout": timeout,
                "read_timeout": timeout,
                "retries": {"total_max_attempts": 1, "mode": "standard"},  # no retry below ours
            },
        )
        self._fs.retries = 1  # s3fs's own retry loop (a class attribute, not a constructor argument)

    @property
    def identity(self) -> str:
        """The bucket and prefix, with the endpoint that serves them (one name on two servers is two buckets)."""
        return self._identity

    def _count(self, event_name: str = "", **_: Any) -> None:
        """botocore event handler: count each HTTP request sent (retries included) by how S3 bills it."""
        self.traffic.count(s3_request_class(event_name.rpartition(".")[2]))

    def _classify(self, error: Exception) -> Failure | None:
        from aiohttp import ClientError as AiohttpError
        from botocore.exceptions import BotoCoreError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotoConnectionError

        where = self.endpoint_url or "AWS S3"
        status = _http_status(error)
        if isinstance(error, FileNotFoundError):
            if "NoSuchBucket" in f"{error} {error.__cause__}":
                return Failure(
                    BucketNotFoundError,
                    f"no bucket {self.bucket!r} at {where}: create it, or let the "
                    "writer create it (it does on its first write)",
                    404,
                )
            return Failure(FileNotFoundError, str(error))
        if isinstance(error, (asyncio.TimeoutError, TimeoutError)):  # the write deadline, socket timeouts
            return Failure(BucketUnreachableError, f"{where} did not answer in time")
        if isinstance(error, (BotoConnectionError, HTTPClientError, AiohttpError, ConnectionError)):
            return Failure(BucketUnreachableError, f"cannot reach {where}: {error}")
        if status == 429 or (status or 0) >= 500:
            return Failure(BucketUnreachableError, f"{where} answered HTTP {status}: {error}")
        if isinstance(error, PermissionError):
            return Failure(
                AccessDeniedError,
                f"access denied by {where} ({error}); check the key and secret "
                "(key=/secret= or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
                status,
            )
        if isinstance(error, (OSError, BotoCoreError)):
            return Failure(StorageError, f"{where}: {error}")
        return None

    def _run(
        self, coroutine: Callable[..., Coroutine[Any, Any, T]], *args: Any, deadline: float | None = None, **kwargs: Any
    ) -> T:
        """Run one of s3fs's async calls on its event loop, cancelled after `deadline` seconds."""
        from fsspec.asyn import sync

        return sync(self._fs.loop, coroutine, *args, timeout=deadline, **kwargs)

    def _key(self, path: str) -> str:
        return f"{self.bucket}/{self.prefix}{path}"

    def _read(self, path: str, max_bytes: int | None, listed: StoredFile | None) -> bytes:
        if max_bytes is None:
            return self._run(self._fs._cat_file, self._key(path), max_concurrency=1)  # one GET, one version
        data = self._run(self._get_at_most, self._key(path), max_bytes + 1)
        if len(data) > max_bytes:
            raise self._too_large(path, max_bytes)
        return data

    async def _get_at_most(self, key: str, limit: int) -> bytes:
        """One GET of the first `limit` bytes (a Range request), read in pieces that stop at `limit` even from a
        server that ignores the range and sends the whole object."""
        bucket, name, _ = self._fs.split_path(key)
        try:
            response = await self._fs._call_s3("get_object", Bucket=bucket, Key=name, Range=f"bytes=0-{limit - 1}")
        except OSError as error:
            if _http_status(error) == 416:  # an empty object has no byte 0 to range over
                return b""
            raise
        body, pieces, got = response["Body"], [], 0
        try:
            while got < limit and (piece := await body.read(min(_READ_PIECE, limit - got))):
                pieces.append(piece)
                got += len(piece)
        finally:
            body.close()
        return b"".join(pieces)

    def _write(self, path: str, data: bytes) -> str | None:
        deadline = self.timeout + len(data) / _MIN_UPLOAD_BYTES_PER_S
        try:
            self._run(self._fs._pipe_file, self._key(path), data, deadline=deadline)
        except FileNotFoundError:  # NoSuchBucket: create it, then write again
            with contextlib.suppress(FileExistsError):  # another writer was quicker
                self._run(self._fs._mkdir, self.bucket)
            self._run(self._fs._pipe_file, self._key(path), data, deadline=deadline)
        return None  # the ETag S3 gives is learnt at the next listing

    def _move(self, source: str, target: str) -> None:
        # One CopyObject, made by the server (up to 5 GB on AWS; a larger file is refused there): never the
        # multipart copy s3fs picks above 2 GiB, whose replies some S3-compatible servers leave incomplete.
        self._run(self._fs._copy_basic, self._key(source), self._key(target))
        self._run(self._fs._rm_file, self._key(source))

    def _list(self, folder: str) -> list[StoredFile]:
        found = self._run(self._fs._find, self._key(folder), detail=True)
        start = len(self._key(""))
        return [StoredFile(name[start:], int(info["size"]), info.get("ETag")) for name, info in found.items()]

    def _delete(self, paths: list[str]) -> None:
        self._run(self._fs._rm, [self._key(p) for p in paths])


def _http_status(error: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError, found on `error` or on the cause s3fs chains to it."""
    for candidate in (error, error.__cause__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict):
            return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


def s3_request_class(operation: str) -> str:
    """How S3 bills a request: "get" (GET and HEAD), "delete" (free on AWS), else "put" (PUT, COPY, POST, LIST)."""
    if operation.startswith(("Get", "Head")):
        return "get"
    if operation.startswith("Delete"):
        return "delete"
    return "put"


def _drop_expect_continue(params: dict[str, Any], **_: Any) -> None:
    """botocore event handler: send uploads without "Expect: 100-continue" (see S3Storage, Blocking)."""
    params["headers"].pop("Expect", None)
