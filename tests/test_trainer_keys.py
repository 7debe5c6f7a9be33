"""The trainer's keys (`trainer_space.keys`): a trainer restarted with a new key and the old one to hand over from
resumes its versions, signs them again, and tells readers of the old key; restarted again without the old key, it still
finds its own; a key to hand over from comes from a file or DELTA_HANDOVER_FROM, never from another user's file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

import delta
from delta.bucket.manifest import write_manifest
from delta.errors import KeyFormatError, PrivateFileError
from delta.signing import previous_key
from tests._states import states_equal
from tests._trainer import trajectory
from trainer_space.keys import TrainerKeys, trainer_keys
from trainer_space.weights import pull_into


def _publish(bucket: str, key: delta.SigningKey, *states, handover_from: delta.SigningKey | None = None) -> None:
    with delta.Publisher(bucket, signing_key=key, handover_from=handover_from) as pub:
        for state in states:
            pub.publish(state)
            assert pub.flush(60)


def keys_of(bucket: str, handover_file: str | None = None) -> tuple[delta.Bucket, TrainerKeys]:
    """The trainer's bucket as its composition root opens it, and what its ranks learn of its keys."""
    opened = delta.Bucket.open(bucket, writer=True, handover_from=previous_key(handover_file))
    return opened, trainer_keys(opened)


def test_a_trainer_restarted_with_a_new_key_and_the_old_one_resumes_its_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = str(tmp_path / "bucket")
    states = trajectory(3)
    old, new = delta.SigningKey.generate(), delta.SigningKey.generate()
    _publish(bucket, old, states[1], states[2])
    monkeypatch.setenv("DELTA_SIGNING_KEY", new.secret_text())

    opened, keys = keys_of(bucket)  # no handover: the old key's versions are someone else's
    assert (opened.signing_key.public, opened.handover_from, keys) == (new.public, None, TrainerKeys(new.public.text))
    assert opened.resume().version == 0
    state = {n: t.clone() for n, t in states[0].items()}

    monkeypatch.setenv("DELTA_HANDOVER_FROM", old.secret_text())
    opened, keys = keys_of(bucket)
    assert opened.handover_from.public == old.public and keys.earlier == old.public.text
    assert [(h.old, h.new) for h in keys.handovers] == [(old.public.text, new.public.text)]
    assert opened.resume().version == 2
    pull_into(state, opened, 2)
    assert states_equal(state, states[2])
    _publish(bucket, new, states[3], handover_from=old)  # signs 1..2 again, then 3

    monkeypatch.delenv("DELTA_HANDOVER_FROM")  # restarted again, without the old key: its versions are its own
    opened, keys = keys_of(bucket)
    assert opened.handover_from is None and keys.earlier is None
    assert [(h.old, h.new) for h in keys.handovers] == [(old.public.text, new.public.text)]  # from the manifest
    assert opened.resume().version == 3
    pull_into(state, opened, 3)
    assert states_equal(state, states[3]) and "this trainer's key" in opened.trust.describe()


def test_a_trainer_rotating_away_from_a_stolen_key_loads_its_own_weights_not_the_thiefs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thief with the old key commits versions 1 and 2 of its own (its own cache: none of the trainer's records)
    as the newest manifest; the trainer handing over from that key resumes its own version 2, found in an older
    manifest, and loads its weights from there, never the thief's of the same number in the newest."""
    bucket, theirs = str(tmp_path / "bucket"), str(tmp_path / "thief")
    states = trajectory(2)
    old, new = delta.SigningKey.generate(), delta.SigningKey.generate()
    _publish(bucket, old, states[1], states[2])
    cache = os.environ["XDG_CACHE_HOME"]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "thief-cache"))
    zeros = {n: torch.zeros_like(t) for n, t in states[2].items()}
    _publish(theirs, old, zeros, zeros)
    monkeypatch.setenv("XDG_CACHE_HOME", cache)
    shutil.copytree(Path(theirs) / "versions", Path(bucket) / "versions", dirs_exist_ok=True)
    storage, forged = delta.Bucket.open(bucket), delta.read_manifest(theirs)
    write_manifest(storage, forged)  # as any writer commits
    assert delta.read_manifest(storage).latest.state_hash == forged.latest.state_hash  # the thief's, newest

    monkeypatch.setenv("DELTA_SIGNING_KEY", new.secret_text())
    monkeypatch.setenv("DELTA_HANDOVER_FROM", old.secret_text())
    opened, _ = keys_of(bucket)
    resume = opened.resume()
    assert resume.version == 2 and resume.entry.state_hash != forged.latest.state_hash
    state = {n: t.clone() for n, t in states[0].items()}
    assert pull_into(state, opened, resume.version, resume.manifest) == resume.entry.state_hash
    assert states_equal(state, states[2])


def test_the_key_to_hand_over_from_comes_from_a_private_file_or_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = str(tmp_path / "bucket")
    old, new = delta.SigningKey.generate(), delta.SigningKey.generate()
    monkeypatch.setenv("DELTA_SIGNING_KEY", new.secret_text())
    kept = tmp_path / "old.key"
    kept.write_text('{"bucket": "file:///elsewhere", "key": "%s"}' % old.secret_text())  # a kept key file
    kept.chmod(0o644)
    assert keys_of(bucket, str(kept))[0].handover_from.public == old.public
    assert oct(kept.stat().st_mode & 0o777) == "0o600"  # made owner-only as it was read
    [handover] = keys_of(bucket, str(kept))[1].handovers  # shown with the run's settings from the start
    assert (handover.old, handover.new) == (old.public.text, new.public.text)
    monkeypatch.setenv("DELTA_HANDOVER_FROM", new.secret_text())  # its own key: no handover
    assert keys_of(bucket)[1].earlier is None
    monkeypatch.setenv("DELTA_HANDOVER_FROM", "ed25519-private:short")
    with pytest.raises(KeyFormatError, match="^DELTA_HANDOVER_FROM does not hold a private key") as e:
        keys_of(bucket)
    assert "short" not in str(e.value)
    link = tmp_path / "link.key"
    link.symlink_to(kept)
    with pytest.raises(PrivateFileError, match="is a symbolic link"):
        keys_of(bucket, str(link))
    with pytest.raises(FileNotFoundError, match="no file at"):
        keys_of(bucket, str(tmp_path / "missing.key"))
    with pytest.raises(KeyFormatError, match="not a key: a key on a command line shows") as e:
        keys_of(bucket, old.secret_text())
    assert old.secret_text()[16:] not in str(e.value)
    assert os.environ["DELTA_SIGNING_KEY"] == new.secret_text()
