"""Ed25519 keys: the trainer signs what it commits to a bucket, readers check it with its public key.

Text forms, one line of ASCII each: a public key is ``ed25519:`` + its 32 bytes in URL-safe base64 without padding;
a fingerprint ``SHA256:`` + their hash, as ssh shows keys; a private key ``ed25519-private:`` + the seed, never in a
bucket nor a log; a signature its 64 bytes. A trainer's key is ``DELTA_SIGNING_KEY``, else an owner-only file per
bucket in ``$XDG_CACHE_HOME/delta/keys/`` (`trainer_key`; `rotate_trainer_key`); a `Handover`, signed with the old
key, introduces a new one to readers that trust the old."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import DeltaFormatError, KeyFormatError, PrivateFileError, shown
from .private import read_private, read_public, write_private

logger = logging.getLogger(__name__)

__all__ = [
    "HANDOVER_VARIABLE",
    "MAX_HANDOVERS",
    "SIGNING_KEY_VARIABLE",
    "TRUSTED_KEY_VARIABLE",
    "Handover",
    "PublicKey",
    "SigningKey",
    "handovers_to",
    "kept_previous_key",
    "make_handover",
    "previous_key",
    "public_key",
    "rotate_trainer_key",
    "trainer_key",
]

#: The variable that gives a trainer its private key (a Space secret), instead of its kept file.
SIGNING_KEY_VARIABLE = "DELTA_SIGNING_KEY"
#: The variable that gives a trainer its previous key (text), which hands over to its key now (`previous_key`).
HANDOVER_VARIABLE = "DELTA_HANDOVER_FROM"
#: The variable that gives a reader the trainer's public key (text or a file holding it), instead of trust on first use.
TRUSTED_KEY_VARIABLE = "DELTA_TRUSTED_KEY"
#: Most key handovers a manifest or the run settings carry: a trainer keeps its last ones (each is a signature that a
#: reader checks at every poll: 20,000 planted ones cost ~16 s). `wire.fleet.MAX_HANDOVERS` is the same number.
MAX_HANDOVERS = 16
_PUBLIC = "ed25519:"
_PRIVATE = "ed25519-private:"
#: The text forms as a stranger's file must hold them (a manifest, run settings).
PUBLIC_KEY_FORM = re.compile(r"ed25519:[A-Za-z0-9_-]{43}")
SIGNATURE_FORM = re.compile(r"[A-Za-z0-9_-]{86}")


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
    """A trainer's public key (`raw`: its 32 bytes). Compared in constant time; hashable."""

    raw: bytes
    _key: Ed25519PublicKey = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_key", Ed25519PublicKey.from_public_bytes(self.raw))

    @classmethod
    def parse(cls, text: str) -> PublicKey:
        """The key in `text` (``ed25519:...``, white space around it ignored).

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
    """A trainer's private key (from its 32-byte `seed`): signs, and gives its public key. Its text form is only what
    `secret_text` returns."""

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
    """The key a trainer signs `bucket`'s versions with (`bucket`: its storage URL): ``DELTA_SIGNING_KEY`` when set,
    else the one kept for the bucket, made now if there is none (processes making it at once agree).

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
    """Replace the key kept for `bucket` with a new one and keep the old one beside it (`kept_previous_key`) for a
    trainer to hand over from; returns (new, old). The old key is written first: no key is lost.

    Raises:
        FileNotFoundError: no key is kept for the bucket.
        FileExistsError: a rotation not finished (delete the previous key's file once the trainer signed with its
            new key, to rotate again).
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
        KeyFormatError, PrivateFileError: as `trainer_key`.
    """
    path = bucket_file("keys", bucket, ".previous.key", environ)
    data = read_private(path)
    return (_kept(path, data) if data is not None else None), path


def public_key(value: str | PublicKey) -> PublicKey:
    """A public key from `value`: a key, its text, or the path of a file of this user's that holds its text (read as
    `read_public` reads: no link, no FIFO, none that others may change; it decides whose weights are applied).

    Raises:
        KeyFormatError: neither, or empty (a missing file is named in the message).
        PrivateFileError: the file is a link, a FIFO, a folder, another user's, or one others may change.
    """
    if isinstance(value, PublicKey):
        return value
    text = value.strip()
    if not text:
        raise KeyFormatError("the trainer's public key is empty: give its text ('ed25519:...') or a file holding it")
    if text.startswith((_PUBLIC, _PRIVATE)):
        return PublicKey.parse(text)
    where = os.path.expanduser(text)
    try:
        data = read_public(where, 4096)
    except PrivateFileError:
        raise
    except OSError as e:  # the text is not quoted: it may be a private key in another form
        raise KeyFormatError(f"not a public key ('ed25519:...') nor a file holding one ({e.strerror})") from None
    if data is None:
        raise KeyFormatError("not a public key ('ed25519:...') nor a file holding one (no such file)")
    try:
        return PublicKey.parse(data.decode("ascii", errors="replace"))
    except KeyFormatError as e:
        raise KeyFormatError(f"{where}: {e}") from None


def previous_key(path: str | None = None, environ: Mapping[str, str] | None = None) -> SigningKey | None:
    """A trainer's previous key: from the private file at `path` (its text, or a key file `trainer_key` kept), else
    ``DELTA_HANDOVER_FROM``; None when neither is set.

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


@dataclass(frozen=True)
class Handover:
    """A trainer's new key introduced by its old one: `signature` is the old key's of `handover_bytes(old, new)`."""

    old: str
    new: str
    signature: str

    @classmethod
    def from_json(cls, body: Any) -> Handover:
        """The handover in `body` (``{"old", "new", "signature"}``); the signature is checked by `Trust`, not here.

        Raises:
            DeltaFormatError: anything else (one line).
        """
        if type(body) is not dict or {"old", "new", "signature"} - body.keys():
            raise DeltaFormatError(f"a handover is an object of old, new and signature, got {shown(body)}")
        for name, form, what in (
            ("old", PUBLIC_KEY_FORM, "'ed25519:' and 43 base64 characters"),
            ("new", PUBLIC_KEY_FORM, "'ed25519:' and 43 base64 characters"),
            ("signature", SIGNATURE_FORM, "86 base64 characters"),
        ):
            if type(body[name]) is not str or not form.fullmatch(body[name]):
                raise DeltaFormatError(f"{name} must be {what}, got {shown(body[name])}")
        return cls(body["old"], body["new"], body["signature"])


#: What a handover's signature covers starts with this (then the old and the new key's text, a line each).
SIGNED_HANDOVER = b"delta-key-handover/1\n"


def handover_bytes(old: str, new: str) -> bytes:
    return SIGNED_HANDOVER + f"{old}\n{new}".encode()


def make_handover(old: SigningKey, new: PublicKey) -> Handover:
    """The handover that introduces `new` to readers that trust `old`."""
    return Handover(old.public.text, new.text, old.sign(handover_bytes(old.public.text, new.text)))


def _valid(handover: Handover) -> bool:
    return PublicKey.parse(handover.old).verify(handover.signature, handover_bytes(handover.old, handover.new))


def handed_over(trusted: PublicKey, signer: PublicKey, handovers: Iterable[Handover]) -> bool:
    """Whether valid handovers lead from `trusted` to `signer` (each signed by the key before it)."""
    reached, frontier = {trusted.text}, [trusted.text]
    handovers = list(handovers)
    while frontier:
        key = frontier.pop()
        for h in handovers:
            if h.old == key and h.new not in reached and _valid(h):
                if h.new == signer.text:
                    return True
                reached.add(h.new)
                frontier.append(h.new)
    return False


def handovers_to(key: PublicKey, handovers: Iterable[Handover]) -> tuple[Handover, ...]:
    """The valid handovers of `handovers` on the chain that ends at `key`, in order: shown to readers so that one
    trusting any key before it trusts `key` (each reader checks every handover itself)."""
    handovers = list(handovers)
    reached, chain = {key.text}, set()
    grew = True
    while grew:
        grew = False
        for i, h in enumerate(handovers):
            if i not in chain and h.new in reached and _valid(h):
                chain.add(i)
                reached.add(h.old)
                grew = True
    return tuple(h for i, h in enumerate(handovers) if i in chain)
