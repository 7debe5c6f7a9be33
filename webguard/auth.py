"""Bearer tokens between the apps: read from ``Authorization`` and compared in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Mapping


def auth_headers(token: str | None) -> dict[str, str]:
    """The ``Authorization`` header that carries ``token`` to another app (none without a token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, None without one."""
    value = headers.get("authorization") or ""
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def token_matches(given: str | None, expected: str | None) -> bool:
    """Whether ``given`` is ``expected`` (constant time, so timing tells nothing); False when either is empty."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(errors="surrogatepass"), expected.encode(errors="surrogatepass"))
