"""Whose versions a reader applies: the trainer's, proven by its Ed25519 signature, never by the bucket.

Every fleet member can write to the bucket, so SHA-256 sums and state hashes prove integrity, not authorship. The
trainer signs each version (`sign_latest`: `Manifest.signed_bytes`) and the run's settings; a reader checks the
signature before it fetches anything (`Trust.check_version`) against a key given (the strongest), trusted on first use
(kept per bucket, as ssh does), or none when told to follow an unsigned bucket (`unauthenticated`, said by every
status). A version unsigned, signed wrongly, by another key, or of another run than the state held is refused in one
line (`UntrustedVersionError`); a new key is trusted only through a handover signed with the key before it.

A trainer's own versions are those its key signed and, before its key's first, those of the key it hands over from
that its own records list (`Trust.own`, `own_versions`, `Published`: that key may be stolen); a handover in the bucket
never makes a key its own. Rotating, it signs those versions again with the new key (`resign`), no other."""

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
from ..signing import TRUSTED_KEY_VARIABLE, Handover, PublicKey, SigningKey, bucket_file, handed_over, public_key
from .manifest import Manifest, VersionEntry
from .published import Published
from .seen import Seen

logger = logging.getLogger(__name__)


def sign_latest(manifest: Manifest, key: SigningKey, run: str) -> Manifest:
    """`manifest` with its newest version signed by `key` as a version of `run`."""
    entry = replace(manifest.versions[-1], run=run, signer=key.public.text, signature=None)
    entry = replace(entry, signature=key.sign(manifest.signed_bytes(entry)))
    return replace(manifest, versions=manifest.versions[:-1] + (entry,))


def own_versions(manifest: Manifest, key: PublicKey, earlier: Iterable[Published] = ()) -> int:
    """The last of `manifest`'s first versions that a trainer signed, 0 for none: with `key`, or, before `key`'s first,
    with one of its `earlier` keys (those it hands over from) where its own records of that key list the version: the
    key may be stolen, and a thief's signature is as good as the trainer's. Versions after it are someone else's."""
    records = {r.key.text: r for r in earlier}
    own, keys = 0, {key.text} | records.keys()
    for entry in manifest.versions:
        if not signed_by(manifest, entry, keys):
            break
        if entry.signer != key.text and not records[str(entry.signer)].lists(manifest, entry):
            break  # the key it hands over from signed it, but not for the trainer, by its records
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
        seen: The newest versions its readers applied (`Seen`; None: kept in this process alone).

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
        seen: Seen | None = None,
    ) -> None:
        self.bucket = bucket
        self.seen = seen if seen is not None else Seen()
        self._key = key
        self._pin = pin
        self._identity = bucket  # what the pin file names (`for_bucket`)
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
        cls,
        bucket: str,
        key: str | PublicKey | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        identity: str | None = None,
    ) -> Trust:
        """Trust `key` (a key, its text or a file holding it) for `bucket`; without one, ``DELTA_TRUSTED_KEY``; without
        that, the key kept for the bucket on its first use (read now), or the first signed one to come. The kept key,
        and the newest versions its readers applied (`Seen`), are filed under the bucket's `identity`
        (`Storage.identity`: a folder's real path; None: `bucket`), so that every spelling of one bucket finds them; a
        key kept under the URL (before identities) is found and filed anew.

        Raises:
            KeyFormatError: the key given, or the one kept, is not a public key; ``DELTA_TRUSTED_KEY`` set but empty.
            PrivateFileError: the key's file, or the kept one, is a link, a FIFO, a folder, another user's, or (the
                key's) one that others may change.
        """
        env = os.environ if environ is None else environ
        given = key
        if given is None and TRUSTED_KEY_VARIABLE in env:
            given = env[TRUSTED_KEY_VARIABLE]
            if not given.strip():
                raise KeyFormatError(
                    f"{TRUSTED_KEY_VARIABLE} is set but empty: set it to the trainer's public key ('ed25519:...') or "
                    "a file holding it, or unset it to trust the first signed version's key"
                )
        identity = identity or bucket
        seen = Seen(bucket_file("trusted", identity, ".seen.json", env))
        if given is not None:
            return cls(bucket, public_key(given), seen=seen)
        pin = bucket_file("trusted", identity, ".json", env)
        kept = _kept_key(pin, identity)
        if kept is None and identity != bucket:
            kept = _kept_key(bucket_file("trusted", bucket, ".json", env), bucket)
            if kept is not None:
                write_private(pin, json.dumps({"bucket": identity, "key": kept.text}).encode())
                logger.info("the key trusted for %s is now kept in %s, under %s", bucket, pin, identity)
        trust = cls(bucket, kept, pin=pin, seen=seen)
        trust._identity = identity
        return trust

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

    def vouches(self, entry: VersionEntry, manifest: Manifest) -> bool:
        """Whether the key trusted now (or one it hands over to in `manifest`) signed `entry`, trusting nothing new:
        what a reader may report of a version before it applies it. False with no key yet (first use trusts only what
        is applied)."""
        if self.unauthenticated:
            return True
        trusted = self._key
        if trusted is None or entry.signer is None or entry.signature is None:
            return False
        try:
            key = PublicKey.parse(entry.signer)
        except KeyFormatError:
            return False
        known = key == trusted or key in self.earlier
        if not known and (self._fixed or not handed_over(trusted, key, manifest.handovers)):
            return False
        return key.verify(entry.signature, manifest.signed_bytes(entry))

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
            write_private(self._pin, json.dumps({"bucket": self._identity, "key": key.text}).encode())
            why += f", kept in {self._pin}"
        self._why = why
        logger.warning("trusting %s for %s: %s", key.fingerprint, self.bucket, why)


def _kept_key(pin: Path, bucket: str) -> PublicKey | None:
    """The key kept in the trust-on-first-use file `pin` for `bucket` (None: none kept, or kept for another bucket).

    Raises:
        KeyFormatError: the file holds no key.
        PrivateFileError: as `read_private`.
    """
    data = read_private(pin)
    if data is None:
        return None
    try:
        body = json.loads(data)
        return PublicKey.parse(body["key"]) if body.get("bucket") == bucket else None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KeyFormatError(
            f"{pin} does not hold the key trusted for {bucket}: delete it to trust the next signed version's key"
        ) from None
