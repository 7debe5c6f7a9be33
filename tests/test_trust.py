"""Weights only from the trainer: versions signed with its key, checked by every reader before anything is applied.

A stranger with write access to the bucket (another process, its own home) publishes a well-formed next version with
`delta.Publisher`, or edits the manifest to carry the trainer's signature: the reader refuses both in one line,
counts them, keeps the trainer's last version and applies the trainer's next one bit for bit. Restarts keep the key
and the run; a new key needs a handover signed with the old one; unsigned buckets are followed only unauthenticated.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from delta import (
    KeyFormatError, PrivateFileError, PublicKey, Publisher, SigningKey, Subscriber, SubscriberConfig, Trust,
    UntrustedVersionError, make_handover, open_storage, own_versions, read_manifest, trainer_key,
)
from delta.bucket.manifest import Manifest, write_manifest
from delta.bucket.trust import sign_latest
from delta.signing import bucket_file, cache_dir, public_key

from ._states import states_equal
from ._stranger import copy_signature, publish_as_stranger
from ._trainer import trajectory

FAST = SubscriberConfig(poll_interval=0.02, max_backoff=0.2)


def publish(pub: Publisher, *states) -> None:
    for s in states:
        pub.publish(s)
        assert pub.flush(timeout=60)


def test_key_texts_round_trip_and_never_quote_a_private_key() -> None:
    key = SigningKey.generate()
    public = key.public
    assert PublicKey.parse(public.text) == public and len(public.text) == 51
    assert public.fingerprint.startswith("SHA256:")
    assert SigningKey.parse(key.secret_text()).public == public
    assert key.secret_text() not in repr(key) and public.fingerprint in repr(key)
    signature = key.sign(b"message")
    assert public.verify(signature, b"message") and not public.verify(signature, b"other")
    assert not public.verify("not a signature", b"message") and not SigningKey.generate().public.verify(signature,
                                                                                                         b"message")
    with pytest.raises(KeyFormatError, match="that is a private key: give its public key instead") as refused:
        public_key(key.secret_text())
    assert key.secret_text()[16:] not in str(refused.value)
    with pytest.raises(KeyFormatError, match="nor a file holding one") as refused:
        public_key(key.secret_text()[16:])  # the bare seed: not quoted back either
    assert key.secret_text()[16:] not in str(refused.value)


def test_a_trainer_key_is_made_once_per_bucket_kept_owner_only_and_the_variable_wins(tmp_path: Path) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    key = trainer_key("file:///data/one", env)
    assert trainer_key("file:///data/one", env).public == key.public  # kept
    assert trainer_key("file:///data/two", env).public != key.public  # one per bucket
    files = sorted((cache_dir(env) / "keys").iterdir())
    assert len(files) == 2 and all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)
    assert oct((cache_dir(env) / "keys").stat().st_mode & 0o777) == "0o700"
    one = bucket_file("keys", "file:///data/one", ".key", env)
    given = SigningKey.generate()
    assert trainer_key("file:///data/one", {**env, "DELTA_SIGNING_KEY": given.secret_text()}).public == given.public
    with pytest.raises(KeyFormatError, match="not a private key"):
        trainer_key("file:///data/one", {**env, "DELTA_SIGNING_KEY": "garbage"})
    one.unlink()
    one.symlink_to(next(f for f in files if f != one))
    with pytest.raises(PrivateFileError, match="is a symbolic link"):
        trainer_key("file:///data/one", env)


def test_a_strangers_versions_are_refused_and_the_trainers_next_applied(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    """The acceptance test, for a `Subscriber`: a stranger's Publisher in its own process and home, then the
    trainer's signature copied onto the stranger's version; each refused in one line, counted once, nothing
    applied; the trainer's next version applied bit for bit."""
    bucket = str(tmp_path / "bucket")
    states = trajectory(4)
    trainer = Publisher(bucket)
    publish(trainer, states[1], states[2])
    reader = Subscriber(bucket, config=FAST)  # no key given: the first signed version's, kept for the bucket
    assert reader.sync() == 2 and "trusted on first use" in reader.status().trust
    trainers = read_manifest(open_storage(bucket)).latest

    assert publish_as_stranger(bucket, tmp_path / "stranger") == 3
    with pytest.raises(UntrustedVersionError, match=r"^version 3 is signed by SHA256:\S+, not by the trusted "
                                                    r"SHA256:\S+, and no handover") as refused:
        reader.sync()
    assert refused.value.reason == "another key"
    assert copy_signature(bucket, trainers) == 3
    with pytest.raises(UntrustedVersionError, match="^version 3: the signature does not match what it signs"):
        reader.sync()
    with pytest.raises(UntrustedVersionError):
        reader.sync()  # the same manifest again: not counted twice
    status = reader.status()
    assert (status.version, status.versions_refused, status.failures) == (2, 2, 0)
    assert status.last_refusal.startswith("version 3: the signature does not match")
    assert states_equal(reader.state, states[2])
    assert sum("REFUSED version 3" in r.getMessage() for r in caplog.records) == 2

    publish(trainer, states[3])  # the trainer goes on from its own manifest: its version 3 drops the stranger's
    trainer.close()
    assert reader.sync() == 3 and states_equal(reader.state, states[3])
    assert reader.status().versions_refused == 2


def test_a_following_subscriber_counts_a_refusal_as_no_failure_and_takes_the_next_version(tmp_path: Path) -> None:
    bucket = str(tmp_path)
    states = trajectory(3)
    trainer = Publisher(bucket)
    publish(trainer, states[1])
    reader = Subscriber(bucket, config=FAST, trust=Trust.for_bucket(open_storage(bucket).url, trainer.public_key))
    reader.start()
    assert reader.wait_for(1, 30)
    with Publisher(bucket, signing_key=SigningKey.generate()) as stranger:
        publish(stranger, states[3])
    deadline = 30.0
    while reader.status().versions_refused == 0 and deadline > 0:
        deadline -= 0.05
        reader.wait_for(99, 0.05)
    publish(trainer, states[2])
    assert reader.wait_for(2, 30) and states_equal(reader.state, states[2])
    reader.close()
    trainer.close()
    status = reader.status()
    assert (status.versions_refused, status.failures, status.version) == (1, 0, 2)
    assert status.trust.endswith("(given)")


def test_a_restarted_trainer_keeps_its_key_and_run_and_leaves_a_strangers_version_behind(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bucket = str(tmp_path)
    states = trajectory(4)
    with Publisher(bucket) as first:
        publish(first, states[1], states[2])
    reader = Subscriber(bucket)
    assert reader.sync() == 2
    with Publisher(bucket, signing_key=SigningKey.generate()) as stranger:
        publish(stranger, states[4])
    with caplog.at_level(logging.WARNING), Publisher(bucket) as second:
        assert second.public_key == first.public_key and second._run_id == first._run_id
        assert second.last.version == 2  # its own last version, not the stranger's 3
        publish(second, states[3])
    assert "versions 3..3 of file://" in caplog.text
    assert "someone else's, ignored; going on from version 2" in caplog.text
    assert reader.sync() == 3 and states_equal(reader.state, states[3]) and reader.status().versions_refused == 0


def test_a_new_key_is_trusted_only_through_a_handover_signed_by_the_old_one(tmp_path: Path) -> None:
    bucket = str(tmp_path)
    url = open_storage(bucket).url
    states = trajectory(4)
    old, new, third = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=old) as pub:
        publish(pub, states[1])
    pinned = Subscriber(bucket)  # trust on first use: the old key, kept
    given = Subscriber(bucket, trust=Trust.for_bucket(url, old.public))
    assert pinned.sync() == 1 and given.sync() == 1
    with Publisher(bucket, signing_key=new, handover_from=old) as rotated:  # on from its own (the old key's) version 1
        assert rotated.last.version == 1
        publish(rotated, states[2])
    assert pinned.sync() == 2 and given.sync() == 2 and states_equal(pinned.state, states[2])
    assert pinned.trust.key == new.public == given.trust.key and "handed over from" in given.status().trust
    assert Trust.for_bucket(url).key == new.public  # the handover is kept in the pinned file
    assert [(h.old, h.new) for h in read_manifest(open_storage(bucket)).handovers] == [(old.public.text,
                                                                                        new.public.text)]
    with Publisher(bucket, signing_key=third) as changed:  # a key change with no handover: refused
        publish(changed, states[4])
    for reader in (pinned, given):
        with pytest.raises(UntrustedVersionError, match=f"not by the trusted {re.escape(new.public.fingerprint)}"):
            reader.sync()
    with Publisher(bucket, signing_key=new) as later:  # its own versions, behind the other key's manifest
        assert later.last.version == 2
        publish(later, states[3])
    assert pinned.sync() == 3 and given.sync() == 3 and states_equal(given.state, states[3])
    slept = Subscriber(bucket, trust=Trust.for_bucket(url, old.public))  # slept through the handover
    assert slept.sync() == 3 and slept.trust.key == new.public


def test_a_rotation_signs_the_trainers_versions_again_so_a_reader_given_the_new_key_loads_them(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The new key takes the old one's versions over at the publisher's start (one manifest write, before any new
    version): a reader given the new key alone loads the bucket from its first version; one that trusted the old key
    (on first use) follows the handover; the run goes on."""
    bucket = str(tmp_path)
    url = open_storage(bucket).url
    states = trajectory(3)
    old, new = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=old) as pub:
        publish(pub, states[1], states[2])
        run = pub._run_id
    pinned = Subscriber(bucket)
    assert pinned.sync() == 2 and pinned.trust.key == old.public
    before = read_manifest(open_storage(bucket))
    with caplog.at_level(logging.WARNING), Publisher(bucket, signing_key=new, handover_from=old) as rotated:
        taken = read_manifest(open_storage(bucket))  # committed on start, nothing published yet
        assert rotated.last.version == 2 and rotated._run_id == run
        assert taken.commit > before.commit and [v.version for v in taken.versions] == [1, 2]
        assert {v.signer for v in taken.versions} == {new.public.text} and {v.run for v in taken.versions} == {run}
        assert [(v.state_hash, v.files) for v in taken.versions] == [(v.state_hash, v.files) for v in before.versions]
        assert [(h.old, h.new) for h in taken.handovers] == [(old.public.text, new.public.text)]
        given = Subscriber(bucket, trust=Trust.for_bucket(url, new.public))
        assert given.sync() == 2 and states_equal(given.state, states[2])  # from the old key's anchor, signed again
        publish(rotated, states[3])
    assert "versions 1..2 signed again with this trainer's new key" in caplog.text
    assert given.sync() == 3 and pinned.sync() == 3 and states_equal(pinned.state, states[3])
    assert pinned.trust.key == new.public and "handed over from" in pinned.status().trust
    committed = read_manifest(open_storage(bucket))
    assert len(committed.handovers) == 1  # committed once
    with Publisher(bucket, signing_key=new, handover_from=old) as again:  # restarted with the setting still there
        assert again.last.version == 3
    assert read_manifest(open_storage(bucket)).commit == committed.commit  # nothing left to take over


def test_a_handover_in_the_bucket_never_makes_a_strangers_key_the_trainers_own(tmp_path: Path) -> None:
    """Anyone can sign a handover from a key of their own to the trainer's: the trainer's own versions are those its
    key signed, and before its key's first those of the key it hands over from, which it holds; versions that key
    signs after the new key's first are not its own either (a stolen old key)."""
    bucket = str(tmp_path / "a")
    url = open_storage(bucket).url
    states = trajectory(4)
    key, stranger = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=key) as pub:
        publish(pub, states[1])
    with Publisher(bucket, signing_key=stranger) as theirs:  # a new run at version 2, signed by the stranger
        publish(theirs, states[2])
    storage = open_storage(bucket)
    manifest = read_manifest(storage)
    write_manifest(storage, replace(manifest, commit=manifest.commit + 1,
                                    handovers=(make_handover(stranger, key.public),)))
    with Publisher(bucket, signing_key=key) as restarted:
        assert restarted.last.version == 1
    own = Trust.own(url, key.public)
    with pytest.raises(UntrustedVersionError, match="not by the trusted SHA256:\\S+, nor by the key it hands over"):
        own.check_version(read_manifest(storage).get(2), read_manifest(storage))
    assert own.key == key.public  # never moved by a handover

    old, new = SigningKey.generate(), SigningKey.generate()  # a rotation, then the old key signs after the new one
    other = str(tmp_path / "b")
    with Publisher(other, signing_key=old) as pub:
        publish(pub, states[1])
    with Publisher(other, signing_key=new, handover_from=old) as rotated:
        publish(rotated, states[2])
    storage = open_storage(other)
    ours = read_manifest(storage)
    theirs = ours.with_version(replace(ours.latest, version=3, base_version=2, base_hash=ours.latest.state_hash))
    write_manifest(storage, sign_latest(theirs, old, ours.latest.run))
    signed = read_manifest(storage)
    assert [v.signer for v in signed.versions] == [new.public.text, new.public.text, old.public.text]
    assert own_versions(signed, new.public, [old.public]) == 2 and own_versions(signed, old.public) == 0
    with Publisher(other, signing_key=new, handover_from=old) as again:
        assert again.last.version == 2


def test_an_unsigned_bucket_is_followed_only_unauthenticated(tmp_path: Path) -> None:
    bucket = str(tmp_path)
    states = trajectory(2)
    with Publisher(bucket) as pub:
        publish(pub, states[1])
    storage = open_storage(bucket)
    manifest = read_manifest(storage)
    unsigned = Manifest(manifest.commit + 1, tuple(replace(v, run=None, signer=None, signature=None)
                                                   for v in manifest.versions))
    assert json.loads(unsigned.to_json())["format_version"] == 1  # what an older delta wrote
    write_manifest(storage, unsigned)
    with pytest.raises(UntrustedVersionError, match="^version 1 is unsigned: .*follow an unsigned bucket only "
                                                    "unauthenticated$"):
        Subscriber(bucket).sync()
    reader = Subscriber(bucket, trust=Trust.unauthenticated_for(storage.url))
    assert reader.sync() == 1 and states_equal(reader.state, states[1])
    status = reader.status()
    assert not status.authenticated and status.trust.startswith("unauthenticated: the weights are applied whoever")


def test_a_version_of_another_run_is_refused_by_a_reader_that_holds_this_one(tmp_path: Path) -> None:
    """The trainer's key signed both runs, but a reader following one never takes the other's versions."""
    bucket = str(tmp_path / "b")
    states = trajectory(3)
    key = SigningKey.generate()
    with Publisher(bucket, signing_key=key) as pub:
        publish(pub, states[1])
    reader = Subscriber(bucket, trust=Trust.for_bucket(open_storage(bucket).url, key.public))
    assert reader.sync() == 1
    storage = open_storage(bucket)
    storage.delete([f.path for f in storage.list("")])  # the bucket emptied: the trainer starts a new run
    with Publisher(bucket, signing_key=key) as pub:
        publish(pub, states[2], states[3])
    with pytest.raises(UntrustedVersionError, match="^version 1 is of run [0-9a-f]{32}, the state held of run "):
        reader.sync()
    assert reader.version == 1 and states_equal(reader.state, states[1])
    assert Subscriber(bucket, trust=Trust.for_bucket(storage.url, key.public)).sync() == 2  # a new reader takes it


def test_no_secret_reaches_the_bucket_or_the_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bucket = tmp_path / "bucket"
    with caplog.at_level(logging.DEBUG):
        with Publisher(str(bucket)) as pub:
            publish(pub, *trajectory(2)[1:])
        key = trainer_key(open_storage(str(bucket)).url)
        Subscriber(str(bucket)).sync()
    secret = key.secret_text()
    seed = secret.split(":", 1)[1]
    for path in bucket.rglob("*"):
        if path.is_file():
            assert seed.encode() not in path.read_bytes(), path
    assert seed not in caplog.text and key.public.fingerprint in caplog.text
    assert os.environ["XDG_CACHE_HOME"] not in str(bucket)
