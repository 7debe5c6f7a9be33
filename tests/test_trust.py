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
import threading
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest

from delta import (Bucket, PublicKey, Publisher, SigningKey, Subscriber, SubscriberConfig, Trust,
                   UntrustedVersionError, read_manifest)
from delta.bucket.manifest import Manifest, manifest_path, write_manifest
from delta.bucket.published import Published
from delta.bucket.trust import own_versions, sign_latest
from delta.errors import KeyFormatError, PrivateFileError
from delta.private import write_private
from delta.signing import bucket_file, cache_dir, make_handover, public_key, trainer_key

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
    trainers = read_manifest(Bucket.open(bucket)).latest

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
    reader = Subscriber(bucket, config=FAST, trust=Trust.for_bucket(Bucket.open(bucket).url, trainer.public_key))
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
    url = Bucket.open(bucket).url
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
    assert [(h.old, h.new) for h in read_manifest(Bucket.open(bucket)).handovers] == [(old.public.text,
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
    url = Bucket.open(bucket).url
    states = trajectory(3)
    old, new = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=old) as pub:
        publish(pub, states[1], states[2])
        run = pub._run_id
    pinned = Subscriber(bucket)
    assert pinned.sync() == 2 and pinned.trust.key == old.public
    before = read_manifest(Bucket.open(bucket))
    with caplog.at_level(logging.WARNING), Publisher(bucket, signing_key=new, handover_from=old) as rotated:
        taken = read_manifest(Bucket.open(bucket))  # committed on start, nothing published yet
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
    committed = read_manifest(Bucket.open(bucket))
    assert len(committed.handovers) == 1  # committed once
    with Publisher(bucket, signing_key=new, handover_from=old) as again:  # restarted with the setting still there
        assert again.last.version == 3
    assert read_manifest(Bucket.open(bucket)).commit == committed.commit  # nothing left to take over


def test_a_handover_in_the_bucket_never_makes_a_strangers_key_the_trainers_own(tmp_path: Path) -> None:
    """Anyone can sign a handover from a key of their own to the trainer's: the trainer's own versions are those its
    key signed, and before its key's first those of the key it hands over from, which it holds; versions that key
    signs after the new key's first are not its own either (a stolen old key)."""
    bucket = str(tmp_path / "a")
    url = Bucket.open(bucket).url
    states = trajectory(4)
    key, stranger = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=key) as pub:
        publish(pub, states[1])
    with Publisher(bucket, signing_key=stranger) as theirs:  # a new run at version 2, signed by the stranger
        publish(theirs, states[2])
    storage = Bucket.open(bucket)
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
    storage = Bucket.open(other)
    ours = read_manifest(storage)
    theirs = ours.with_version(replace(ours.latest, version=3, base_version=2, base_hash=ours.latest.state_hash))
    write_manifest(storage, sign_latest(theirs, old, ours.latest.run))
    signed = read_manifest(storage)
    assert [v.signer for v in signed.versions] == [new.public.text, new.public.text, old.public.text]
    records = Published.of(storage.url, old.public)  # what the old key signed, by the trainer's own records
    assert own_versions(signed, new.public, [records]) == 2 and own_versions(signed, old.public) == 0
    with Publisher(other, signing_key=new, handover_from=old) as again:
        assert again.last.version == 2


def test_a_rotation_away_from_a_stolen_key_takes_over_and_resumes_only_the_trainers_own_versions(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 64, item 3. A thief with the trainer's old key, in its own process and home, publishes version 3; the
    trainer rotates away from that key. It signs again only the versions its own records show it published (1, 2),
    resumes from 2 and says in one line that 3 is not its own. A reader given only the new key never applies what the
    old key signs after 2 (refused in one line, counted) and applies the trainer's next version, numbered past the
    thief's; so does a reader that trusted the old key and applied the thief's version (no freeze)."""
    bucket = str(tmp_path / "bucket")
    url = Bucket.open(bucket).url
    states = trajectory(3)
    old, new = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=old) as pub:
        publish(pub, states[1], states[2])
    trainers = read_manifest(Bucket.open(bucket))
    pinned = Subscriber(bucket, config=FAST)  # trusts the old key on first use
    assert pinned.sync() == 2
    assert publish_as_stranger(bucket, tmp_path / "thief", key=old) == 3
    assert pinned.sync() == 3  # the old key signed it: rotation is not revocation

    with caplog.at_level(logging.WARNING), Publisher(bucket, signing_key=new, handover_from=old) as rotated:
        assert (rotated.last.version, rotated.last.state_hash) == (2, trainers.latest.state_hash)
        taken = read_manifest(Bucket.open(bucket))
        assert [v.version for v in taken.versions] == [1, 2] and {v.signer for v in taken.versions} == {new.public.text}
        assert [v.state_hash for v in taken.versions] == [v.state_hash for v in trainers.versions]
        given = Subscriber(bucket, config=FAST, trust=Trust.for_bucket(url, new.public))
        assert given.sync() == 2 and states_equal(given.state, states[2])

        assert publish_as_stranger(bucket, tmp_path / "thief", key=old) == 4  # the thief goes on from its 3
        with pytest.raises(UntrustedVersionError, match=f"^version 3 is signed by {re.escape(old.public.fingerprint)}, "
                                                        f"not by the trusted {re.escape(new.public.fingerprint)}") as e:
            given.sync()
        assert e.value.reason == "another key"
        assert (given.status().version, given.status().versions_refused) == (2, 1)

        publish(rotated, states[3])
        assert rotated.last.version == 4
    refusals = [r.getMessage() for r in caplog.records if "not in this trainer's own records" in r.getMessage()]
    assert len(refusals) == 1 and "version 3 of" in refusals[0] and "going on from version 2" in refusals[0]
    assert given.sync() == 4 and states_equal(given.state, states[3]) and given.status().versions_refused == 1
    assert pinned.sync() == 4 and states_equal(pinned.state, states[3]) and pinned.trust.key == new.public
    with Publisher(bucket, signing_key=new, handover_from=old) as again:  # restarted with the setting still there
        assert again.last.version == 4


def test_a_trainer_without_its_records_of_the_old_key_takes_over_none_of_its_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The old key's versions were published from another machine (or a cache not kept): the trainer cannot show any
    of them to be its own, so it signs none again and starts a new run past them, with an anchor, which a reader given
    the new key follows, and one that trusted the old key follows through the handover once restarted."""
    bucket = str(tmp_path / "bucket")
    url = Bucket.open(bucket).url
    states = trajectory(3)
    old, new = SigningKey.generate(), SigningKey.generate()
    with Publisher(bucket, signing_key=old) as pub:
        publish(pub, states[1], states[2])
        run = pub._run_id
    pinned = Subscriber(bucket, config=FAST)
    assert pinned.sync() == 2
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "another-machine"))
    with caplog.at_level(logging.WARNING), Publisher(bucket, signing_key=new, handover_from=old) as rotated:
        assert rotated.last is None and rotated._run_id != run
        assert {v.signer for v in read_manifest(Bucket.open(bucket)).versions} == {old.public.text}  # none taken
        publish(rotated, states[3])
        assert rotated.last.version == 3 and rotated.last.kind == "anchor"
    assert "versions 1..2 of file://" in caplog.text and "starting a new run, numbering its next version 3" in caplog.text
    given = Subscriber(bucket, config=FAST, trust=Trust.for_bucket(url, new.public))
    assert given.sync() == 3 and states_equal(given.state, states[3])
    with pytest.raises(UntrustedVersionError, match="restart the reader to follow a new run"):
        pinned.sync()  # as for any new run
    restarted = Subscriber(bucket, config=FAST)  # trusted the old key on first use: follows the handover
    assert restarted.sync() == 3 and states_equal(restarted.state, states[3]) and restarted.trust.key == new.public


def test_what_an_older_delta_kept_as_applied_names_no_key_and_still_holds_readers_back(tmp_path: Path) -> None:
    """The records of versions applied name the key that signed them (they bind only that key's versions); a file kept
    by an older `delta`, without keys, binds every key, as it did."""
    bucket = str(tmp_path)
    storage = Bucket.open(bucket)
    states = trajectory(2)
    with Publisher(bucket) as pub:
        publish(pub, states[1], states[2])
        run = pub._run_id
    kept = bucket_file("trusted", storage.storage.identity, ".seen.json")
    write_private(kept, json.dumps({"runs": [[run, 5]]}).encode())
    with pytest.raises(UntrustedVersionError, match="ends at version 2, older than version 5 already applied"):
        Subscriber(bucket).sync()
    kept.unlink()
    reader = Subscriber(bucket)
    assert reader.sync() == 2
    assert json.loads(kept.read_bytes()) == {"runs": [[run, 2, pub.public_key.text]]}


def test_an_unsigned_bucket_is_followed_only_unauthenticated(tmp_path: Path) -> None:
    bucket = str(tmp_path)
    states = trajectory(2)
    with Publisher(bucket) as pub:
        publish(pub, states[1])
    storage = Bucket.open(bucket)
    manifest = read_manifest(storage)
    unsigned = Manifest(manifest.commit + 1, tuple(replace(v, run=None, signer=None, signature=None)
                                                   for v in manifest.versions))
    assert "signature" not in json.loads(unsigned.to_json())["versions"][0]  # a stranger's, or TRL's
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
    reader = Subscriber(bucket, trust=Trust.for_bucket(Bucket.open(bucket).url, key.public))
    assert reader.sync() == 1
    storage = Bucket.open(bucket)
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
        key = trainer_key(Bucket.open(str(bucket)).url)
        Subscriber(str(bucket)).sync()
    secret = key.secret_text()
    seed = secret.split(":", 1)[1]
    for path in bucket.rglob("*"):
        if path.is_file():
            assert seed.encode() not in path.read_bytes(), path
    assert seed not in caplog.text and key.public.fingerprint in caplog.text
    assert os.environ["XDG_CACHE_HOME"] not in str(bucket)


def test_a_trusted_key_file_is_read_only_when_it_is_a_regular_file_of_this_users_that_no_one_else_may_change(
        tmp_path: Path) -> None:
    """The file given by `--trusted-key` or DELTA_TRUSTED_KEY decides whose weights are applied: a link, a FIFO (it
    hung the reader) or a file others may write to is refused in one line, at once; one others may read is taken, and
    left as it was; an empty DELTA_TRUSTED_KEY is said, never taken for an unset one (trust on first use)."""
    from delta.cli import main

    bucket = str(tmp_path / "bucket")
    key = SigningKey.generate()
    with Publisher(bucket, signing_key=key) as pub:
        publish(pub, trajectory(2)[1])
    url = Bucket.open(bucket).url
    good = tmp_path / "trainer.pub"
    good.write_text(key.public.text + "\n")
    good.chmod(0o644)
    assert Trust.for_bucket(url, str(good)).key == key.public
    assert Trust.for_bucket(url, environ={"DELTA_TRUSTED_KEY": str(good)}).key == key.public
    assert oct(good.stat().st_mode & 0o777) == "0o644"  # a public key: others may read it

    link = tmp_path / "link.pub"
    link.symlink_to(good)
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    writable = tmp_path / "writable.pub"
    writable.write_text(key.public.text)
    writable.chmod(0o666)
    for path, why in ((link, "is a symbolic link"), (fifo, r"is not a regular file \(a FIFO\)"),
                      (writable, r"can be changed by other users \(mode 666; chmod go-w it\)")):
        refused: list[BaseException] = []

        def read(path: Path = path) -> None:
            try:
                Trust.for_bucket(url, environ={"DELTA_TRUSTED_KEY": str(path)})
            except BaseException as e:  # noqa: BLE001 - handed to the test's thread
                refused.append(e)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), f"reading {path.name} hung"
        assert isinstance(refused[0], PrivateFileError) and re.search(f"{path.name}: {why}: refused", str(refused[0]))
        err = StringIO()
        with redirect_stderr(err), redirect_stdout(StringIO()):
            code = main(["pull", "--bucket", bucket, "--trusted-key", str(path), "-o", str(tmp_path / "out")])
        assert code == 1 and len(err.getvalue().splitlines()) == 1 and why.split(" ")[0] in err.getvalue()

    for empty in ("", "  "):
        with pytest.raises(KeyFormatError, match="^DELTA_TRUSTED_KEY is set but empty: set it to the trainer's "):
            Trust.for_bucket(url, environ={"DELTA_TRUSTED_KEY": empty})
        with pytest.raises(KeyFormatError, match="^the trainer's public key is empty"):
            Trust.for_bucket(url, empty)
    with pytest.raises(KeyFormatError, match=f"^{re.escape(str(writable))}: not a public key"):
        writable.chmod(0o644)
        writable.write_text(key.secret_text())
        Trust.for_bucket(url, str(writable))


def test_trust_on_first_use_is_kept_for_the_folder_whatever_path_opens_it(tmp_path: Path) -> None:
    """The pin is filed under the folder's real path: opened again through a link or a `..` path, the bucket that a
    stranger emptied and filled with a run of their own is not trusted on first use again. A pin kept under the path
    as typed (before this) is still found, and filed anew."""
    states = trajectory(2)
    real = tmp_path / "data" / "bucket"
    trainer, stranger = SigningKey.generate(), SigningKey.generate()
    with Publisher(str(real), signing_key=trainer) as pub:
        publish(pub, states[1])
    assert Subscriber(str(real)).sync() == 1  # trusted on first use, and kept
    (tmp_path / "link").symlink_to(real)
    (tmp_path / "other").mkdir()
    storage = Bucket.open(str(real))
    storage.delete([f.path for f in storage.list("")])
    with Publisher(str(real), signing_key=stranger) as pub:
        publish(pub, states[2])
    for spelling in (tmp_path / "link", tmp_path / "other" / ".." / "data" / "bucket"):
        reader = Subscriber(str(spelling))
        with pytest.raises(UntrustedVersionError, match=f"not by the trusted {re.escape(trainer.public.fingerprint)}"):
            reader.sync()
        assert reader.version is None and reader.trust.key == trainer.public

    upgraded = tmp_path / "upgraded"  # a pin an earlier delta kept, under the URL the folder was opened by
    with Publisher(str(upgraded), signing_key=stranger) as pub:
        publish(pub, states[1])
    (tmp_path / "up-link").symlink_to(upgraded)
    typed = Bucket.open(str(tmp_path / "up-link")).url
    assert typed != Bucket.open(str(upgraded)).storage.identity
    old_pin = bucket_file("trusted", typed, ".json")
    write_private(old_pin, json.dumps({"bucket": typed, "key": trainer.public.text}).encode())
    with pytest.raises(UntrustedVersionError, match="not by the trusted"):
        Subscriber(str(tmp_path / "up-link")).sync()
    with pytest.raises(UntrustedVersionError, match="not by the trusted"):
        Subscriber(str(upgraded)).sync()  # filed anew under the real path: every spelling finds it

    from delta.storage import open_storage  # remote buckets: their name with the server that serves it

    s3 = [open_storage(url, endpoint_url=end).identity for url, end in (("s3://b/run/", "http://minio:9000/"),
                                                                        ("s3://b/run", "http://minio:9000"),
                                                                        ("s3://b/run", "http://other:9000"))]
    assert s3[0] == s3[1] == "s3://b/run at http://minio:9000" != s3[2]
    hub = [open_storage(url, endpoint=end).identity for url, end in (("hf://buckets/team/run/", "https://hub.one/"),
                                                                     ("hf://buckets/team/run", "https://hub.two"))]
    assert hub[0] == "hf://buckets/team/run at https://hub.one" != hub[1]


def test_a_trainer_that_rotated_more_often_than_a_manifest_may_say_keeps_its_last_handovers(tmp_path: Path) -> None:
    """Readers refuse a manifest of more than 16 handovers (each one a signature checked at every poll), so a trainer
    keeps its last 16: its 18th key is followed by a reader that trusted its 3rd."""
    bucket = str(tmp_path)
    url = Bucket.open(bucket).url
    states = trajectory(18, n=2_000)
    keys = [SigningKey.generate() for _ in range(18)]
    with Publisher(bucket, signing_key=keys[0]) as pub:
        publish(pub, states[1])
    for i in range(1, 18):
        with Publisher(bucket, signing_key=keys[i], handover_from=keys[i - 1]) as pub:
            publish(pub, states[i + 1])
    manifest = read_manifest(Bucket.open(bucket))
    assert [h.new for h in manifest.handovers] == [k.public.text for k in keys[2:]]  # the last 16 of 17
    third = Subscriber(bucket, trust=Trust.for_bucket(url, keys[2].public))
    assert third.sync() == 18 and third.trust.key == keys[17].public and states_equal(third.state, states[18])


def test_a_reader_never_goes_back_when_an_older_manifest_is_committed_again(tmp_path: Path) -> None:
    """Every signature of an older manifest of the trainer's holds: committed again under a new number, it took a
    reader from version 4 back to 2 (lag 0). Now refused in one line and counted, by the running reader and by a
    restarted one (the newest versions applied are kept beside the trust); the trainer's next version is applied; a
    new run of the trainer is followed, and an earlier run's manifest replayed after it is refused."""
    bucket = str(tmp_path / "bucket")
    storage = Bucket.open(bucket)
    states = trajectory(5)
    trainer = Publisher(bucket)
    publish(trainer, states[1], states[2])
    older = json.loads(storage.read(read_manifest(storage).path))
    publish(trainer, states[3], states[4])
    reader = Subscriber(bucket, config=FAST)
    assert reader.sync() == 4

    def commit_again(body: dict) -> str:
        path = manifest_path(read_manifest(storage).commit + 1)
        storage.write(path, json.dumps(dict(body, commit=int(path[10:20]))).encode())
        return path

    path = commit_again(older)
    with pytest.raises(UntrustedVersionError, match=rf"^the newest manifest \({path}\) ends at version 2, older than "
                                                    r"version 4 already applied: an old manifest committed again") as e:
        reader.sync()
    assert e.value.reason == "rollback"
    status = reader.status()
    assert (status.version, status.lag, status.versions_refused, status.failures) == (4, 0, 1, 0)
    assert status.last_refusal.startswith(f"the newest manifest ({path}) ends at version 2")
    assert states_equal(reader.state, states[4])
    restarted = Subscriber(bucket, config=FAST)
    with pytest.raises(UntrustedVersionError, match="older than version 4 already applied"):
        restarted.sync()
    assert restarted.version is None

    publish(trainer, states[5])
    trainer.close()
    assert reader.sync() == 5 and restarted.sync() == 5 and states_equal(restarted.state, states[5])

    last_of_first_run = json.loads(storage.read(read_manifest(storage).path))
    storage.delete([f.path for f in storage.list("")])  # emptied: the trainer starts a new run
    with Publisher(bucket) as second:
        publish(second, states[1])
    assert Subscriber(bucket, config=FAST).sync() == 1  # a new run: followed by a restarted reader
    commit_again(last_of_first_run)
    with pytest.raises(UntrustedVersionError, match=r"ends at version 5 of run [0-9a-f]{32}, an earlier run than "):
        Subscriber(bucket, config=FAST).sync()
