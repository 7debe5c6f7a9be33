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
  first use and kept, so a restarted trainer signs with the same key (`trainer_key`); `rotate_trainer_key` replaces
  it with a new one and keeps the old one beside it, to hand over from (`kept_previous_key`);
- a reader's trusted key: given (``DELTA_TRUSTED_KEY``, an argument, a file holding it), or trusted on first use
  and kept per bucket in ``$XDG_CACHE_HOME/delta/trusted/<hash>.json`` (`delta.bucket.trust`);
- a trainer's previous key, when its key replaces it (a handover signed with it introduces the new key to readers):
  a file of the user's (``--handover-from-file``: the key's text, or a kept key file) or ``DELTA_HANDOVER_FROM``
  (the key's text, a Space secret), never a command-line value: a private key must not show in ``ps``
  (`previous_key`).
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
#: The variable that gives a trainer its previous key (text), which hands over to its key now (`previous_key`).
HANDOVER_VARIABLE = "DELTA_HANDOVER_FROM"
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
    return _kept(path, data)


def _kept(path: Path, data: bytes) -> SigningKey:
    """The key in a kept key file's bytes (``{"bucket": ..., "key": "ed25519-private:..."}``)."""
    try:
        return SigningKey.parse(json.loads(data)["key"])
    except (ValueError, KeyError, TypeError, AttributeError):  # KeyFormatError is a ValueError
        raise KeyFormatError(f"{path} does not hold a signing key: move it away to make a new one") from None


def rotate_trainer_key(bucket: str, environ: Mapping[str, str] | None = None) -> tuple[SigningKey, SigningKey]:
    """Replace the key kept for `bucket` (`trainer_key`'s file) with a new one, and keep the old one beside it
    (``<hash>.previous.key``, owner-only: `kept_previous_key`) for a trainer to hand over from; returns (new, old).
    The old key is written first: whatever stops this half way, no key is lost.

    Raises:
        FileNotFoundError: no key is kept for the bucket (nothing to rotate).
        FileExistsError: a previous key is kept already: a rotation not finished (delete that file once the trainer
            signed with its new key, to rotate again).
        KeyFormatError, PrivateFileError: as `trainer_key`.
    """
    env = os.environ if environ is None else environ
    path = bucket_file("keys", bucket, ".key", env)
    data = read_private(path)
    if data is None:
        raise FileNotFoundError(f"no signing key is kept for {bucket} ({path}): nothing to rotate")
    old = _kept(path, data)
    previous = bucket_file("keys", bucket, ".previous.key", env)
    if not write_private(previous, json.dumps({"bucket": bucket, "key": old.secret_text()}).encode(), replace=False):
        raise FileExistsError(
            f"{previous} holds the key that a rotation of {bucket}'s key replaced: the trainer hands over from it; "
            "delete it once the trainer signed with its new key (python -m delta log shows each version's signer), "
            "then rotate again"
        )
    new = SigningKey.generate()
    write_private(path, json.dumps({"bucket": bucket, "key": new.secret_text()}).encode())
    logger.warning(
        "the signing key of %s is now %s, kept in %s; the key it replaces, %s, is kept in %s to hand over from",
        bucket,
        new.public.fingerprint,
        path,
        old.public.fingerprint,
        previous,
    )
    return new, old


def kept_previous_key(bucket: str, environ: Mapping[str, str] | None = None) -> tuple[SigningKey | None, Path]:
    """The key that `rotate_trainer_key` replaced for `bucket` (None: none kept) and the file that keeps it.

    Raises:
        KeyFormatError, PrivateFileError: the file holds no key, or is a link, a FIFO, a folder or another user's.
    """
    path = bucket_file("keys", bucket, ".previous.key", environ)
    data = read_private(path)
    return (_kept(path, data) if data is not None else None), path


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


def previous_key(path: str | None = None, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """A trainer's previous key, which its key now replaces: read from the file at `path` when given, else from
    ``DELTA_HANDOVER_FROM``; None when neither is set. A `Publisher` given it (``handover_from``) signs a handover from
    it to its key, so that readers that trust it trust the new key too.

    Args:
        path: A private file of this user's (`delta.private`: no link, no FIFO, nobody else's) holding the key's text
            (``ed25519-private:...``), or a key file that `trainer_key` kept (its JSON).

    Raises:
        KeyFormatError: the file or the variable does not hold a private key (neither is quoted).
        FileNotFoundError: there is no file at `path`.
        PrivateFileError: the file is a link, a FIFO, a folder or another user's.
    """
    env = os.environ if environ is None else environ
    if path is None:
        text = env.get(HANDOVER_VARIABLE) or ""
        if not text:
            return None
        try:
            return SigningKey.parse(text)
        except KeyFormatError:
            raise KeyFormatError(
                f"{HANDOVER_VARIABLE} does not hold a private key: expected 'ed25519-private:' and 43 base64 "
                "characters (the trainer's previous key)"
            ) from None
    if path.strip().startswith((_PRIVATE, _PUBLIC)):  # the key given as a path: refused, and never quoted
        raise KeyFormatError(
            "expected the path of a file holding the trainer's previous key, not a key: a key on a command line shows "
            f"in the process list to every user of the machine; put it in a file of yours, or in {HANDOVER_VARIABLE}"
        )
    where = os.path.expanduser(path)
    data = read_private(where)
    if data is None:
        raise FileNotFoundError(f"no file at {where} (the trainer's previous key, --handover-from-file)")
    text = data.decode("ascii", errors="replace").strip()
    if text.startswith("{"):  # a key file `trainer_key` kept
        try:
            text = json.loads(text)["key"]
        except (ValueError, KeyError, TypeError):
            text = ""
    try:
        return SigningKey.parse(text if isinstance(text, str) else "")
    except KeyFormatError:
        raise KeyFormatError(
            f"{where} does not hold a private key: expected 'ed25519-private:' and 43 base64 characters, or a key "
            "file kept in ~/.cache/delta/keys"
        ) from None
