"""Who may do what to a bucket, and how the Hub says no: a pure function of the caller and the bucket, so each
decision is a row of a table (see `tests/test_local_hub.py`).

The refusals carry the Hub's `X-Error-Code` / `X-Error-Message` headers, which huggingface_hub's
`hf_raise_for_status` turns into its exception classes. Each case, its answer, and where the answer comes from ("client" = read in huggingface_hub's code, "inferred" =
chosen here because neither client shows it):

- A token that is unknown or revoked, on any Hub route: 401, `X-Error-Message: Invalid credentials in
  Authorization header`, no code. Message: client (`hf_raise_for_status` tests that exact string). That the Hub
  answers so even on public buckets: inferred.
- The bucket does not exist: 404, `X-Error-Code: RepoNotFound`. Code: client (`RepoNotFound` on `/api/buckets/...`
  becomes `BucketNotFoundError`). Status and message: inferred.
- A private bucket, no token: 401 `RepoNotFound`. Client (`hf_raise_for_status`'s comment: the Hub answers 401 for
  private repos when not authenticated).
- A private bucket, the token of someone without access: 404 `RepoNotFound`. Inferred (the Hub does not reveal that
  a private repo exists).
- A write with a read token, or into a namespace that is neither the caller's nor one of its orgs: 403, no code.
  Status: client (`create_bucket(exist_ok=True)`'s comment "403 -> if no write permission"); message: inferred.
- A write or a bucket creation without a token: 401, no code. Inferred.
- Creating a bucket that exists: 409 whose JSON still holds `url`. Client (`create_bucket` reads
  `response.json()["url"]` after letting a 409 through).

Read access to a public bucket needs no token. Members of an org read and write the org's buckets with a write token.
Space repositories (`space_routes.py`) follow the same rules with `kind="Space"`: their files, variables, secrets and
hardware are the Space's "write"; their info and variables its "read".
"""

from __future__ import annotations

from dataclasses import dataclass

from .store import Bucket, Scope, Space, Store

INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


@dataclass(frozen=True)
class Caller:
    """Who sent a request, from its `Authorization: Bearer` header.

    Attributes:
        user: The token's user; None when anonymous or when the token is bad.
        scope: The token's scope; None when anonymous.
        bad_token: A token was sent but it is unknown or revoked.
        token: The token as sent (for counting per token); never logged in full.
    """

    user: str | None
    scope: Scope | None
    bad_token: bool = False
    token: str | None = None


@dataclass(frozen=True)
class Refusal:
    """An error answer: status, `X-Error-Code` (or None), `X-Error-Message`."""

    status: int
    code: str | None
    message: str


def caller_from_header(store: Store, authorization: str | None) -> Caller:
    """Resolve a `Bearer` Hub token; anything else in the header is a bad token."""
    if not authorization:
        return Caller(None, None)
    value = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
    token = store.tokens.get(value)
    if token is None or token.revoked:
        return Caller(None, None, bad_token=True, token=value or None)
    return Caller(token.user, token.scope, token=value)


def check_token(caller: Caller) -> Refusal | None:
    """The check every Hub route makes first: a token that was sent must be valid."""
    return Refusal(401, None, INVALID_CREDENTIALS) if caller.bad_token else None


def check_read(store: Store, caller: Caller, bucket_id: str, bucket: Bucket | Space | None,
               kind: str = "Bucket") -> Refusal | None:
    """May `caller` read `bucket_id` (None when it does not exist)? `kind` names it in refusals (`"Space"` for a
    Space repository, which follows the same rules)."""
    if refusal := check_token(caller):
        return refusal
    if bucket is None:
        return Refusal(404, "RepoNotFound", f"{kind} {bucket_id} not found")
    if not bucket.private:
        return None
    if caller.user is None:
        return Refusal(401, "RepoNotFound", f"{kind} {bucket_id} not found")
    if bucket.namespace not in store.namespaces_of(caller.user):
        return Refusal(404, "RepoNotFound", f"{kind} {bucket_id} not found")
    return None


def check_write(store: Store, caller: Caller, bucket_id: str, bucket: Bucket | Space | None,
                kind: str = "Bucket") -> Refusal | None:
    """May `caller` change `bucket_id` (its files, settings, or delete it)? Read access is checked first, so a
    private bucket stays hidden from strangers."""
    if refusal := check_read(store, caller, bucket_id, bucket, kind):
        return refusal
    return _check_namespace_write(store, caller, bucket_id.split("/", 1)[0], f"{kind.lower()} {bucket_id}")


def check_create(store: Store, caller: Caller, namespace: str) -> Refusal | None:
    """May `caller` create a bucket in `namespace`?"""
    if refusal := check_token(caller):
        return refusal
    return _check_namespace_write(store, caller, namespace, f"the namespace {namespace}")


def _check_namespace_write(store: Store, caller: Caller, namespace: str, what: str) -> Refusal | None:
    if caller.user is None:
        return Refusal(401, None, f"You must be authenticated to write to {what}")
    if caller.scope != "write":
        return Refusal(403, None, f"Your token is read-only: it cannot write to {what}; use a token with write access")
    if namespace not in store.namespaces_of(caller.user):
        return Refusal(403, None, f"You don't have the rights to write to {what}")
    return None
