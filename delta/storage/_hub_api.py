"""The Hub's bucket routes a `HfBucketStorage` needs, sent through an HTTP client of its own.

The same requests huggingface_hub's `HfApi` sends for its bucket calls (tree, paths-info, batch, create, Xet token),
made here because `HfApi` sends through one process-wide client (`huggingface_hub.utils.get_session`): this client's
response hook counts each request into the storage's `Traffic` by the Hub's classes, keeps the limit its `RateLimit`
headers report, and turns a 429 into `RateLimitedReply` at once (huggingface_hub would wait and ask again, up to five
times a whole window, unseen by the pages). huggingface_hub still does the rest: its headers, its errors
(`hf_raise_for_status`, read by `_hf_errors`), hf_xet's sessions. Retries are the storage's (`RetryPolicy`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from ._traffic import RateLimit, Traffic

#: Seconds a request may wait for a connection or for data.
TIMEOUT_S = 60.0
#: A Xet token is fetched again this long before it expires.
_TOKEN_MARGIN_S = 60.0


class RateLimitedReply(Exception):
    """The Hub answered 429 (raised from the response hook).

    Attributes:
        wait_s: Seconds the Hub asked to wait (`RateLimit`'s reset, else `Retry-After`), or None where it named none.
        text: What the reply said, for the message.
    """

    def __init__(self, wait_s: float | None, text: str) -> None:
        super().__init__(text)
        self.wait_s = wait_s
        self.text = text


class BatchFailed(Exception):
    """The Hub did not apply some operations of a batch call (listed in its `failed`).

    Attributes:
        failures: The Hub's `{"path", "error"}` entries.
        status: The reply's status.
    """

    def __init__(self, failures: list[dict[str, Any]], status: int) -> None:
        super().__init__(f"{len(failures)} operation(s) failed")
        self.failures = failures
        self.status = status


class HubApi:
    """One bucket's Hub routes, counted into `traffic`. Thread-safe; the Xet tokens are kept per scope.

    Args:
        endpoint: The Hub's URL.
        bucket_id: `namespace/name`.
        headers: The request headers huggingface_hub builds for the token (`build_hf_headers`).
        traffic: Where requests are counted.
    """

    def __init__(self, endpoint: str, bucket_id: str, headers: dict[str, str], traffic: Traffic) -> None:
        import httpx2
        from huggingface_hub.utils._http import hf_request_event_hook

        self.endpoint, self.bucket_id, self.headers, self.traffic = endpoint, bucket_id, headers, traffic
        self._http = httpx2.Client(
            event_hooks={"request": [hf_request_event_hook], "response": [self._count]},
            follow_redirects=True,
            timeout=TIMEOUT_S,
        )
        self._tokens: dict[str, Any] = {}  # scope -> huggingface_hub's XetConnectionInfo
        self._lock = threading.Lock()

    @property
    def _bucket(self) -> str:
        return f"{self.endpoint}/api/buckets/{self.bucket_id}"

    def tree(self, prefix: str | None) -> Iterator[dict[str, Any]]:
        """Every entry under `prefix` (recursive), page by page (`Link: rel="next"`)."""
        url: str | None = f"{self._bucket}/tree" + ("/" + quote(prefix, safe="") if prefix else "")
        params: dict[str, Any] | None = {"recursive": True}
        while url is not None:
            response = self._request("GET", url, params=params)
            yield from response.json()
            url, params = response.links.get("next", {}).get("url"), None

    def paths_info(self, paths: list[str]) -> list[dict[str, Any]]:
        """The entries of those of `paths` that are files (the others are left out)."""
        return self._request("POST", f"{self._bucket}/paths-info", json={"paths": paths}).json()

    def batch(self, operations: list[dict[str, Any]]) -> None:
        """Apply `operations` (the ndjson lines huggingface_hub sends: addFile, copyFile, deleteFile).

        Raises:
            BatchFailed: the Hub did not apply some of them (the others are applied: not a transaction).
        """
        from huggingface_hub.utils import hf_raise_for_status

        body = b"".join(json.dumps(op).encode() + b"\n" for op in operations)
        headers = {"Content-Type": "application/x-ndjson", **self.headers}
        response = self._http.request("POST", f"{self._bucket}/batch", headers=headers, content=body)
        if response.status_code in (200, 422) and (failed := response.json().get("failed")):
            raise BatchFailed(failed, response.status_code)
        hf_raise_for_status(response)

    def create(self, private: bool | None) -> None:
        """Create the bucket. One that exists is no error (409), nor is a token that may not create (401, 403): the
        write that follows says what is wrong, as huggingface_hub's `create_bucket(exist_ok=True)` lets it."""
        from huggingface_hub.utils import hf_raise_for_status

        payload = {} if private is None else {"visibility": "private" if private else "public"}
        response = self._http.request("POST", self._bucket, headers=self.headers, json=payload)
        if response.status_code not in (401, 403, 409):
            hf_raise_for_status(response)

    def xet_token(self, scope: str) -> Any:
        """A Xet token of `scope` ("read" or "write"), kept until a minute before it expires (one request per
        token's lifetime): huggingface_hub's `XetConnectionInfo`."""
        from huggingface_hub.utils._xet import parse_xet_connection_info_from_headers

        with self._lock:
            kept = self._tokens.get(scope)
            if kept is not None and kept.expiration_unix_epoch > time.time() + _TOKEN_MARGIN_S:
                return kept
            info = parse_xet_connection_info_from_headers(self._request("GET", self.token_url(scope)).headers)
            if info is None:
                raise ConnectionError(f"the Hub's answer to {self.token_url(scope)} holds no Xet token")
            self._tokens[scope] = info
            return info

    def forget_token(self, scope: str) -> None:
        """Drop the kept token of `scope` (Xet storage refused it): the next transfer fetches a fresh one."""
        with self._lock:
            self._tokens.pop(scope, None)

    def token_url(self, scope: str) -> str:
        """The route that hands out Xet tokens of `scope` for this bucket (hf_xet refreshes through it)."""
        return f"{self._bucket}/xet-{scope}-token"

    def _request(self, method: str, url: str, **options: Any) -> Any:
        from huggingface_hub.utils import hf_raise_for_status

        response = self._http.request(method, url, headers=self.headers, **options)
        hf_raise_for_status(response)
        return response

    def _count(self, response: Any) -> None:
        """Response hook: count the request, keep the limit it reports, raise on a 429."""
        self.traffic.count(request_class(response.request.url.path))
        limit = rate_limit(response.headers)
        if limit is not None:
            self.traffic.saw_limit(limit)
        if response.status_code == 429:
            told = (
                f"{limit.resource} quota {limit.limit or '?'} per {limit.window_s or '?'} s spent" if limit else "429"
            )
            message = response.headers.get("X-Error-Message")
            raise RateLimitedReply(
                retry_after(response.headers, limit),
                f"the Hub answered HTTP 429 Too Many Requests ({told})" + (f": {message}" if message else ""),
            )


def request_class(path: str) -> str:
    """The Hub's class of a request to `path`: "resolver" for `/resolve/` URLs, else "api"."""
    return "resolver" if "/resolve/" in path else "api"


def rate_limit(headers: Any) -> RateLimit | None:
    """The limit a reply's `RateLimit` and `RateLimit-Policy` headers report, or None (parsed as huggingface_hub
    parses them)."""
    from huggingface_hub.utils import parse_ratelimit_headers

    info = parse_ratelimit_headers(headers)
    if info is None:
        return None
    now = time.time()
    return RateLimit(
        info.resource_type, info.remaining, now + info.reset_in_seconds, info.limit, info.window_seconds, now
    )


def retry_after(headers: Any, limit: RateLimit | None) -> float | None:
    """Seconds a 429 asks to wait: the window's reset where the limit is spent, else `Retry-After`, else None."""
    if limit is not None and limit.remaining == 0:
        return max(0.0, limit.reset_at - time.time())
    value = (headers.get("Retry-After") or "").strip()
    return float(value) if value.isdigit() else None
