"""Ed25519 keys: the trainer signs what it commits to a bucket, readers check it with its public key.

Text forms, one line of ASCII each (fit for an environment variable, a Space secret, a command line):

- public key: ``ed25519:`` + the 32 raw bytes in URL-safe base64 without padding (51 characters);
- fingerprint: ``SHA256:`` + the SHA-256 of those 32 bytes in base64 without padding, as ssh shows keys;
- private key: ``ed25519-private:`` + the 32-byte seed, the same way. Never in a bucket, never in a log: the
  object's `repr` hides it, and no error message quotes text that may hold one;
- signature: the 64 bytes, the same way (86 characters).

Where keys live (environment variables are read here, at call time):

- a trainer's key: ``DELTA_SIGNING_KEY`` (a Space secret) when set; else an owner-only file per bucket,
  ``$XDG_CACHE_HOME/delta/keys/<hash of the bucket URL>.key`` (``~/.cache`` without XDG_CACHE_HOME), made at the
  first use and kept, so a restarted trainer signs with the same key (`trainer_key`);
- a reader's trusted key: given (``DELTA_TRUSTED_KEY``, an argument, a file holding it), or trusted on first use
  and kept per bucket in ``$XDG_CACHE_HOME/delta/trusted/<hash>.json`` (`delta.bucket.trust`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import KeyFormatError
from .private import read_private, write_private

logger = logging.getLogger(__name__)

#: The variable that gives a trainer its private key (a Space secret), instead of its kept file.
SIGNING_KEY_VARIABLE = "DELTA_SIGNING_KEY"
#: The variable that gives a reader the trainer's public key (text or a file holding it), instead of trust on first use.
TRUSTED_KEY_VARIABLE = "DELTA_TRUSTED_KEY"
_PUBLIC = "ed25519:"
_PRIVATE = "ed25519-private:"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str, size: int) -> bytes | None:
    """The `size` bytes that `text` encodes (`_b64`), or None when it encodes anything else."""
    if len(text) != -(-size * 4 // 3) or not text.isascii():
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    return raw if len(raw) == size and _b64(raw) == text else None


@dataclass(frozen=True)
class PublicKey:
    """A trainer's public key. Compared in constant time (`==`); hashable.

    Attributes:
        raw: The 32 bytes.
    """

    raw: bytes
    _key: Ed25519PublicKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", Ed25519PublicKey.from_public_bytes(self.raw))

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """The key in `text` (``ed25519:...``, surrounding white space ignored).

        Raises:
            KeyFormatError: not a public key in that form (a private key pasted here is not quoted back).
        """
        text = text.strip()
        raw = _unb64(text[len(_PUBLIC) :], 32) if text.startswith(_PUBLIC) else None
        if raw is None:
            hint = "; that is a private key: give its public key instead" if text.startswith(_PRIVATE) else ""
            raise KeyFormatError(f"not a public key: expected 'ed25519:' and 43 base64 characters{hint}")
        return cls(raw)

    @property
    def text(self) -> str:
        return _PUBLIC + _b64(self.raw)

    @property
    def fingerprint(self) -> str:
        """``SHA256:...``, short enough to show and compare by eye."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.raw).digest()).rstrip(b"=").decode()

    def verify(self, signature: str, message: bytes) -> bool:
        """Whether `signature` (text) is this key's signature of `message`; False for any text that is not one."""
        raw = _unb64(signature, 64) if isinstance(signature, str) else None
        if raw is None:
            return False
        try:
            self._key.verify(raw, message)
        except InvalidSignature:
            return False
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and hmac.compare_digest(self.raw, other.raw)

    def __hash__(self) -> int:
        return hash(self.raw)

    def __str__(self) -> str:
        return self.fingerprint


class SigningKey:
    """A trainer's private key: signs, and gives its public key. Its text form is only what `secret_text` returns.

    Args:
        seed: The 32-byte Ed25519 seed.
    """

    def __init__(self, seed: bytes) -> None:
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = PublicKey(self._key.public_key().public_bytes_raw())

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate().private_bytes_raw())

    @classmethod
    def parse(cls, text: str) -> SigningKey:
        """The key in `text` (``ed25519-private:...``).

        Raises:
            KeyFormatError: not a private key in that form (the text is never quoted).
        """
        text = text.strip()
        seed = _unb64(text[len(_PRIVATE) :], 32) if text.startswith(_PRIVATE) else None
        if seed is None:
            raise KeyFormatError("not a private key: expected 'ed25519-private:' and 43 base64 characters")
        return cls(seed)

    def secret_text(self) -> str:
        """The private key as text: for a Space secret or the key's own file, never for a log."""
        return _PRIVATE + _b64(self._key.private_bytes_raw())

    def sign(self, message: bytes) -> str:
        """The signature of `message`, as text."""
        return _b64(self._key.sign(message))

    def __repr__(self) -> str:
        return f"SigningKey(public={self.public.fingerprint})"


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/delta`` (``~/.cache/delta`` without it): where kept and trusted keys live."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "delta"


def bucket_file(folder: str, bucket: str, suffix: str, environ: Mapping[str, str] | None = None) -> Path:
    """The file of `bucket` (its storage URL) in `folder` of the cache: named by the URL's hash, never by the URL."""
    return cache_dir(environ) / folder / f"{hashlib.sha256(bucket.encode()).hexdigest()[:16]}{suffix}"


def trainer_key(bucket: str, environ: Mapping[str, str] | None = None) -> SigningKey:
    """The key a trainer signs `bucket`'s versions and run settings with: ``DELTA_SIGNING_KEY`` when set, else the
    one kept for the bucket, made now (and said so) if there is none. Several processes making it at once agree:
    one writes it, the others read it.

    Args:
        bucket: The bucket's storage URL (`Storage.url`: one spelling per bucket).

    Raises:
        KeyFormatError: the variable or the kept file does not hold a private key.
        PrivateFileError: the kept file is a link, a FIFO, a folder or another user's.
    """
    env = os.environ if environ is None else environ
    if env.get(SIGNING_KEY_VARIABLE):
        return SigningKey.parse(env[SIGNING_KEY_VARIABLE])
    path = bucket_file("keys", bucket, ".key", env)
    data = read_private(path)
    if data is None:
        made = SigningKey.generate()
        if write_private(path, json.dumps({"bucket": bucket, "key": made.secret_text()}).encode(), replace=False):
            logger.info("made a signing key for %s: %s, kept in %s (owner-only)", bucket, made.public.fingerprint, path)
            return made
        data = read_private(path) or b""
    try:
        return SigningKey.parse(json.loads(data)["key"])
    except (ValueError, KeyError, TypeError, AttributeError):  # KeyFormatError is a ValueError
        raise KeyFormatError(f"{path} does not hold a signing key: move it away to make a new one") from None


def public_key(value: str | PublicKey) -> PublicKey:
    """A public key from `value`: a key, its text, or the path of a file that holds its text.

    Raises:
        KeyFormatError: neither (a missing file is named in the message).
    """
    if isinstance(value, PublicKey):
        return value
    text = value.strip()
    if text.startswith((_PUBLIC, _PRIVATE)):
        return PublicKey.parse(text)
    try:
        with open(os.path.expanduser(text), encoding="ascii", errors="replace") as f:
            return PublicKey.parse(f.read(4096))
    except OSError as e:  # the text is not quoted: it may be a private key in another form
        raise KeyFormatError(f"not a public key ('ed25519:...') nor a file holding one ({e.strerror})") from None
