"""Whose versions a reader applies: the trainer's, proven by its Ed25519 signature, never by the bucket.

Every fleet member can write to the bucket, so a file's SHA-256 and a state hash prove that nothing was torn or
changed on the way, not who wrote it. The trainer signs each version it commits (`sign_latest`: the version's
`Manifest.signed_bytes`) and the run's settings; a reader checks the signature before it fetches anything
(`Trust.check_version`) against the key it trusts:

- a key it is given (an argument, ``DELTA_TRUSTED_KEY``, a file holding it): the strongest;
- else the key of the first signed version it checks, trusted on first use as ssh does, kept per bucket in an
  owner-only file (``$XDG_CACHE_HOME/delta/trusted/<hash>.json``) and said so in the log;
- or none at all when told to follow an unsigned bucket (TRL's own delta files, a run of an older `delta`):
  `Trust.unauthenticated`, which every status then says.

A version unsigned, signed wrongly, signed by another key, or of another run than the state held is refused
(`UntrustedVersionError`, one line) and nothing of it is applied. A trainer's new key is trusted only through a
handover signed with the key trusted before it (`make_handover`: in the manifest, and in the run's settings); the
reader then trusts the new key (and keeps it, when it was trusted on first use).

A trainer's own versions are those its key signed, and, before its key's first, those of the one key it hands over
from (it holds that key: `Trust.own`, `own_versions`). A handover in the bucket never makes a key the trainer's own:
anyone can sign one from a key of their own to the trainer's. Rotating, the trainer signs its versions again with the
new key (`resign`), so that a reader given the new key alone can load them.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from ..errors import KeyFormatError, UntrustedVersionError
from ..private import read_private, write_private
from ..signing import TRUSTED_KEY_VARIABLE, PublicKey, SigningKey, bucket_file, public_key
from .manifest import Handover, Manifest, VersionEntry

logger = logging.getLogger(__name__)

#: What a handover's signature covers starts with this (then the old and the new key's text, a line each).
SIGNED_HANDOVER = b"delta-key-handover/1\n"


def handover_bytes(old: str, new: str) -> bytes:
    return SIGNED_HANDOVER + f"{old}\n{new}".encode()


def make_handover(old: SigningKey, new: PublicKey) -> Handover:
    """The handover that introduces `new` to readers that trust `old`."""
    return Handover(old.public.text, new.text, old.sign(handover_bytes(old.public.text, new.text)))


def sign_latest(manifest: Manifest, key: SigningKey, run: str) -> Manifest:
    """`manifest` with its newest version signed by `key` as a version of `run`."""
    entry = replace(manifest.versions[-1], run=run, signer=key.public.text, signature=None)
    entry = replace(entry, signature=key.sign(manifest.signed_bytes(entry)))
    return replace(manifest, versions=manifest.versions[:-1] + (entry,))


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
    """The valid handovers of `handovers` on a chain that ends at `key`, in their order: what a trainer shows readers
    (in its run's settings) so that a reader that trusts any key before it on the chain trusts `key`. Only shown:
    each reader checks every handover itself."""
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


def own_versions(manifest: Manifest, key: PublicKey, earlier: Iterable[PublicKey] = ()) -> int:
    """The last of `manifest`'s first versions that a trainer signed, 0 for none: with `key`, or, before `key`'s first,
    with one of the `earlier` keys (its own previous ones: it holds them). Versions after it are someone else's."""
    own, keys = 0, {key.text} | {k.text for k in earlier}
    for entry in manifest.versions:
        if not signed_by(manifest, entry, keys):
            break
        own = entry.version
        if entry.signer == key.text:
            keys = {key.text}  # the new key signed: from here on, what an earlier key signs is not the trainer's
    return own


def resign(manifest: Manifest, key: SigningKey) -> Manifest:
    """`manifest` with every version signed again by `key` (a trainer's new key taking over its versions), the next
    commit."""
    versions = []
    for entry in manifest.versions:
        entry = replace(entry, signer=key.public.text, signature=None)
        versions.append(replace(entry, signature=key.sign(manifest.signed_bytes(entry))))
    return replace(manifest, commit=manifest.commit + 1, versions=tuple(versions))


def signed_by(manifest: Manifest, entry: VersionEntry, keys: set[str]) -> bool:
    """Whether `entry` carries a valid signature of one of `keys` (public key texts)."""
    if entry.signature is None or entry.signer not in keys:
        return False
    return PublicKey.parse(entry.signer).verify(entry.signature, manifest.signed_bytes(entry))


class Trust:
    """The key a reader takes a bucket's versions and run settings from. Thread-safe: the readers of one bucket in a
    process (the weights' subscriber, the run settings' reader) share one, so that they trust the same key.

    Args:
        bucket: The bucket's storage URL.
        key: The trainer's public key; None: trusted on first use (`pin`), or nothing checked (`unauthenticated`).
        pin: Trust on first use: the owner-only file that keeps the key trusted for the bucket.
        unauthenticated: Apply what the bucket holds, signed or not, whoever wrote it.
        earlier: Keys whose signatures are taken beside `key`'s, with no handover: a trainer's own previous key (`own`).

    Build it with `for_bucket`, `own`, or `unauthenticated_for`.
    """

    def __init__(
        self,
        bucket: str,
        key: PublicKey | None = None,
        *,
        pin: Path | None = None,
        unauthenticated: bool = False,
        earlier: Iterable[PublicKey] = (),
    ) -> None:
        self.bucket = bucket
        self._key = key
        self._pin = pin
        self.unauthenticated = unauthenticated
        self.earlier = frozenset(earlier)
        self._fixed = False  # a trainer's own trust (`own`): never moved to another key by a handover
        self._why = "given" if pin is None else f"trusted on first use, kept in {pin}"
        self._lock = threading.Lock()

    @classmethod
    def own(cls, bucket: str, key: PublicKey, earlier: Iterable[PublicKey] = ()) -> Trust:
        """A trainer's trust in its own bucket: what `key` signed, or an `earlier` key of its own (the one it hands
        over from, which it holds); never another key, whatever handover the bucket holds. Pick the version to resume
        with `own_versions`: an earlier key counts only before `key`'s first version."""
        trust = cls(bucket, key, earlier=earlier)
        trust._fixed = True
        trust._why = "this trainer's key" + (
            f"; before it, {', '.join(sorted(k.fingerprint for k in trust.earlier))}" if trust.earlier else ""
        )
        return trust

    @classmethod
    def for_bucket(
        cls, bucket: str, key: str | PublicKey | None = None, environ: Mapping[str, str] | None = None
    ) -> Trust:
        """Trust `key` (a key, its text or a file holding it) for `bucket`; without one, ``DELTA_TRUSTED_KEY``; without
        that, the key kept for the bucket on its first use (read now), or the first signed one to come.

        Raises:
            KeyFormatError: the key given, or the one kept, is not a public key.
            PrivateFileError: the kept file is a link, a FIFO, a folder or another user's.
        """
        env = os.environ if environ is None else environ
        given = key if key is not None else env.get(TRUSTED_KEY_VARIABLE) or None
        if given is not None:
            return cls(bucket, public_key(given))
        pin = bucket_file("trusted", bucket, ".json", env)
        data = read_private(pin)
        kept = None
        if data is not None:
            try:
                body = json.loads(data)
                kept = PublicKey.parse(body["key"]) if body.get("bucket") == bucket else None
            except (ValueError, KeyError, TypeError, AttributeError):
                raise KeyFormatError(
                    f"{pin} does not hold the key trusted for {bucket}: delete it to trust the next "
                    "signed version's key"
                ) from None
        return cls(bucket, kept, pin=pin)

    @classmethod
    def unauthenticated_for(cls, bucket: str) -> Trust:
        """No check: for an unsigned bucket, on purpose. Whoever can write to it decides the weights."""
        logger.warning("following %s unauthenticated: its versions are applied whoever wrote them", bucket)
        return cls(bucket, unauthenticated=True)

    @property
    def key(self) -> PublicKey | None:
        """The key trusted now (None: none yet, or unauthenticated)."""
        return self._key

    def describe(self) -> str:
        """One line for a status or a page: which key, and why it is trusted."""
        if self.unauthenticated:
            return "unauthenticated: the weights are applied whoever wrote them"
        if self._key is None:
            return "no key yet: the first signed version's is trusted (trust on first use)"
        return f"trainer key {self._key.fingerprint} ({self._why})"

    def check_version(self, entry: VersionEntry, manifest: Manifest, held_run: str | None = None) -> None:
        """Refuse `entry` unless the trusted key (or a key it handed over to in `manifest`) signed it, as a version
        of the run the state held is of (`held_run`; None: any).

        Raises:
            UntrustedVersionError: see the module docstring; the message names the version and why.
        """
        if self.unauthenticated:
            return
        what = f"version {entry.version}"
        self.check(
            entry.signer, entry.signature, manifest.signed_bytes(entry), what, manifest.handovers, version=entry.version
        )
        if held_run is not None and entry.run != held_run:
            raise UntrustedVersionError(
                f"{what} is of run {entry.run}, the state held of run {held_run}: a new run "
                "on this bucket, or versions replayed from another; restart the reader to "
                "follow a new run",
                version=entry.version,
                reason="another run",
            )

    def check(
        self,
        signer: str | None,
        signature: str | None,
        message: bytes,
        what: str,
        handovers: Iterable[Handover] = (),
        *,
        version: int | None = None,
    ) -> None:
        """Refuse `message` unless `signature` is the trusted key's (or, through `handovers`, a later key's). Trusts
        `signer` if no key is trusted yet (first use: kept and said so), or if the handovers introduce it.

        Raises:
            UntrustedVersionError: unsigned, signed by another key, or a signature that does not match.
        """
        if self.unauthenticated:
            return
        if signer is None or signature is None:
            raise UntrustedVersionError(
                f"{what} is unsigned: not written by the trainer's Publisher (an older delta, "
                "TRL's files, or a stranger); follow an unsigned bucket only unauthenticated",
                version=version,
                reason="unsigned",
            )
        try:
            key = PublicKey.parse(signer)
        except KeyFormatError:
            raise UntrustedVersionError(
                f"{what} names no valid signing key", version=version, reason="bad signature"
            ) from None
        with self._lock:
            trusted = self._key
            known = key == trusted or key in self.earlier
            if trusted is not None and not known and (self._fixed or not handed_over(trusted, key, handovers)):
                why = (
                    "nor by the key it hands over from"
                    if self._fixed
                    else "and no handover signed by the trusted key introduces it"
                )
                raise UntrustedVersionError(
                    f"{what} is signed by {key.fingerprint}, not by the trusted {trusted.fingerprint}, {why}",
                    version=version,
                    reason="another key",
                )
            if not key.verify(signature, message):
                raise UntrustedVersionError(
                    f"{what}: the signature does not match what it signs (forged or edited)",
                    version=version,
                    reason="bad signature",
                )
            if trusted is None:
                self._trust(key, f"trusted on first use (the key of {what})")
            elif not known:
                self._trust(key, f"handed over from {trusted.fingerprint}")

    def _trust(self, key: PublicKey, why: str) -> None:
        """Trust `key` from now on (`_lock` held), kept in the pin file when trust came on first use."""
        self._key = key
        if self._pin is not None:
            write_private(self._pin, json.dumps({"bucket": self.bucket, "key": key.text}).encode())
            why += f", kept in {self._pin}"
        self._why = why
        logger.warning("trusting %s for %s: %s", key.fingerprint, self.bucket, why)
