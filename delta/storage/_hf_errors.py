"""What the Hub's answers mean to a bucket's caller: each failure of huggingface_hub, hf_xet or the network becomes
one `Failure` that says what the Hub said and what to do about it.

The Hub answers a bucket call with HTTP statuses and `X-Error-Code` / `X-Error-Message` headers, which
huggingface_hub turns into its exceptions; hf_xet, for its own requests (Xet tokens it refreshes, Xet storage),
raises builtins whose text holds the status ("... 403 Forbidden ..."). Both are read here by status, so that a refused
token is never taken for an unreachable Hub (and retried forever), a private bucket read without a token never for an
empty one, and a failed entry of a batch never for a failure the publisher cannot retry.
"""

from __future__ import annotations

import functools
import importlib
import re
from dataclasses import dataclass

from ..errors import (
    AccessDeniedError,
    BucketNotFoundError,
    BucketUnreachableError,
    RateLimitedError,
    StorageError,
)
from ._base import Failure
from ._hf_xet import XetTransferError
from ._hub_api import BatchFailed, RateLimitedReply

_STATUS_IN_TEXT = re.compile(r"\b([45]\d\d)\b")
_INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class HubCall:
    """What a failure is about, for the message.

    Attributes:
        endpoint: The Hub's URL.
        bucket_id: `namespace/name`.
        has_token: Whether a token was sent.
        writing: Whether the call writes (a write needs a token with write access).
    """

    endpoint: str
    bucket_id: str
    has_token: bool
    writing: bool


def classify(error: Exception, call: HubCall) -> Failure | None:
    """The failure `error` stands for, or None for an exception that is not the Hub's nor the network's (a bug)."""
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, OfflineModeIsEnabled

    if type(error) is FileNotFoundError:  # ours: paths-info does not list the file
        return Failure(FileNotFoundError, str(error))
    if isinstance(error, RateLimitedReply):
        return Failure(RateLimitedError, error.text, 429, error.wait_s)
    if isinstance(error, OfflineModeIsEnabled):
        return Failure(StorageError, "HF_HUB_OFFLINE is set; unset it to reach the Hub")
    if isinstance(error, BatchFailed):
        first = error.failures[0]
        return Failure(
            BucketUnreachableError,
            f"the Hub did not apply {len(error.failures)} operation(s) of the batch (first: "
            f"{first.get('path', '?')}: {first.get('error', '?')}); nothing else of it is relied on, "
            "and it is sent again",
            error.status,
        )
    if isinstance(error, EntryNotFoundError) and not isinstance(error, HfHubHTTPError):
        return Failure(FileNotFoundError, str(error))
    if isinstance(error, HfHubHTTPError):
        status = _status_of(error)
        said = _said(error)
        if status == 404 and isinstance(error, EntryNotFoundError):
            return Failure(FileNotFoundError, str(error))
        return by_status(status, said, call) if status is not None else None
    if isinstance(error, XetTransferError):
        return _xet_failure(error.cause, call)
    if isinstance(error, _transport_errors()):
        return Failure(BucketUnreachableError, f"cannot reach the Hub at {call.endpoint}: {error}")
    return None


def by_status(status: int, said: str, call: HubCall) -> Failure:
    """What an HTTP status from the Hub (or its Xet storage) means, with `said`, the Hub's own words."""
    if status == 401:
        if said == _INVALID_CREDENTIALS:
            return Failure(
                AccessDeniedError,
                "the Hub refused the token (HTTP 401: invalid credentials): it is wrong, "
                "expired or revoked; set HF_TOKEN to a valid token or run `hf auth login`",
                status,
            )
        if not call.has_token:
            return Failure(
                AccessDeniedError,
                f"the Hub sent HTTP 401 and no token was sent: the bucket "
                f"{call.bucket_id} is private, or does not exist; set HF_TOKEN (or run `hf auth login`) "
                "with a token that can read it",
                status,
            )
        return Failure(
            AccessDeniedError,
            f"the Hub refused the token (HTTP 401{': ' + said if said else ''}); set "
            "HF_TOKEN to a valid token or run `hf auth login`",
            status,
        )
    if status == 403:
        need = "write access" if call.writing else "read access"
        return Failure(
            AccessDeniedError,
            f"the Hub refused the token (HTTP 403{': ' + said if said else ''}): it "
            f"needs {need} to the bucket {call.bucket_id} (its namespace "
            f"{call.bucket_id.split('/')[0]}); make one at {call.endpoint}/settings/tokens "
            "(a reader needs read access only)",
            status,
        )
    if status == 404:
        return Failure(
            BucketNotFoundError,
            f"no bucket {call.bucket_id} on {call.endpoint} (or the token cannot see "
            f"it): create it (`hf buckets create {call.bucket_id}`, or let the writer create it: "
            "create=True, `--create`)",
            status,
        )
    if status == 429:
        return Failure(
            RateLimitedError, f"the Hub answered HTTP 429 Too Many Requests{': ' + said if said else ''}", status
        )
    if status == 408 or status >= 500:
        return Failure(BucketUnreachableError, f"the Hub answered HTTP {status}{': ' + said if said else ''}", status)
    return Failure(StorageError, f"the Hub answered HTTP {status}{': ' + said if said else ''}", status)


def _xet_failure(cause: BaseException, call: HubCall) -> Failure:
    """hf_xet's builtins: the status its text holds decides, as for the Hub's own answers."""
    import hf_xet

    text = f"{type(cause).__name__}: {cause}"
    if isinstance(cause, hf_xet.XetAuthenticationError):
        return Failure(
            AccessDeniedError,
            f"Xet storage refused the token ({text}); set HF_TOKEN to a token with "
            f"{'write' if call.writing else 'read'} access to the bucket {call.bucket_id}",
            401,
        )
    if isinstance(cause, hf_xet.XetObjectNotFoundError):
        return Failure(StorageError, f"Xet storage holds no content for this file ({text})")
    found = _STATUS_IN_TEXT.search(str(cause))
    if found and int(found.group(1)) in (401, 403):
        return Failure(
            AccessDeniedError,
            f"Xet storage refused the token (HTTP {found.group(1)}: {cause}); set "
            f"HF_TOKEN to a token with {'write' if call.writing else 'read'} access to the bucket "
            f"{call.bucket_id}",
            int(found.group(1)),
        )
    if found:
        failure = by_status(int(found.group(1)), f"Xet storage: {cause}", call)
        if failure.kind is not BucketNotFoundError or "/xet-" in str(cause):  # a 404 of Xet storage is no bucket's
            return failure
        return Failure(StorageError, f"Xet storage answered HTTP 404 ({text})", 404)
    if isinstance(cause, (ConnectionError, TimeoutError)):
        return Failure(BucketUnreachableError, f"cannot reach Xet storage for {call.endpoint}: {text}")
    return Failure(StorageError, f"the Xet transfer failed: {text}")


def _status_of(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _said(error: BaseException) -> str:
    """The Hub's own words for a failure: its `X-Error-Message` header, else nothing."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    return (headers.get("X-Error-Message") or "") if headers is not None else ""


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the Hub was not reached: httpx2's transport errors (huggingface_hub 2.x) and the
    builtin ones."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module in ("httpx2", "httpx"):
        try:
            errors.append(importlib.import_module(module).TransportError)
        except ImportError:
            continue
    return tuple(errors)
