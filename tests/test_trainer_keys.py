"""The trainer's keys (`trainer_space.keys`): a trainer restarted with a new key and the old one to hand over from
resumes its versions, signs them again, and tells readers of the old key; restarted again without the old key, it still
finds its own; a key to hand over from comes from a file or DELTA_HANDOVER_FROM, never from another user's file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import delta
from tests._states import states_equal
from tests._trainer import trajectory
from trainer_space.keys import TrainerKeys, load_keys
from trainer_space.weights import resume


def _publish(bucket: str, key: delta.SigningKey, *states, handover_from: delta.SigningKey | None = None) -> None:
    with delta.Publisher(bucket, signing_key=key, handover_from=handover_from) as pub:
        for state in states:
            pub.publish(state)
            assert pub.flush(60)


def test_a_trainer_restarted_with_a_new_key_and_the_old_one_resumes_its_versions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = str(tmp_path / "bucket")
    states = trajectory(3)
    old, new = delta.SigningKey.generate(), delta.SigningKey.generate()
    _publish(bucket, old, states[1], states[2])
    monkeypatch.setenv("DELTA_SIGNING_KEY", new.secret_text())

    key, previous, keys = load_keys(bucket)  # no handover: the old key's versions are someone else's
    assert (key.public, previous, keys) == (new.public, None, TrainerKeys(new.public.text))
    state = {n: t.clone() for n, t in states[0].items()}
    assert resume(state, bucket, keys.trust(bucket)) == (0, None)

    monkeypatch.setenv("DELTA_HANDOVER_FROM", old.secret_text())
    key, previous, keys = load_keys(bucket)
    assert previous.public == old.public and keys.earlier == old.public.text
    assert [(h.old, h.new) for h in keys.handovers] == [(old.public.text, new.public.text)]
    version, digest = resume(state, bucket, keys.trust(bucket))
    assert version == 2 and states_equal(state, states[2])
    _publish(bucket, key, states[3], handover_from=previous)  # signs 1..2 again, then 3

    monkeypatch.delenv("DELTA_HANDOVER_FROM")  # restarted again, without the old key: its versions are its own
    key, previous, keys = load_keys(bucket)
    assert previous is None and keys.earlier is None
    assert [(h.old, h.new) for h in keys.handovers] == [(old.public.text, new.public.text)]  # from the manifest
    assert resume(state, bucket, keys.trust(bucket))[0] == 3 and states_equal(state, states[3])
    assert "this trainer's key" in keys.trust(bucket).describe()


def test_the_key_to_hand_over_from_comes_from_a_private_file_or_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bucket = str(tmp_path / "bucket")
    old, new = delta.SigningKey.generate(), delta.SigningKey.generate()
    monkeypatch.setenv("DELTA_SIGNING_KEY", new.secret_text())
    kept = tmp_path / "old.key"
    kept.write_text('{"bucket": "file:///elsewhere", "key": "%s"}' % old.secret_text())  # a kept key file
    kept.chmod(0o644)
    assert load_keys(bucket, str(kept))[1].public == old.public
    assert oct(kept.stat().st_mode & 0o777) == "0o600"  # made owner-only as it was read
    [handover] = load_keys(bucket, str(kept))[2].handovers  # shown with the run's settings from the start
    assert (handover.old, handover.new) == (old.public.text, new.public.text)
    monkeypatch.setenv("DELTA_HANDOVER_FROM", new.secret_text())  # its own key: no handover
    assert load_keys(bucket)[1] is None
    monkeypatch.setenv("DELTA_HANDOVER_FROM", "ed25519-private:short")
    with pytest.raises(delta.KeyFormatError, match="^DELTA_HANDOVER_FROM does not hold a private key") as e:
        load_keys(bucket)
    assert "short" not in str(e.value)
    link = tmp_path / "link.key"
    link.symlink_to(kept)
    with pytest.raises(delta.PrivateFileError, match="is a symbolic link"):
        load_keys(bucket, str(link))
    with pytest.raises(FileNotFoundError, match="no file at"):
        load_keys(bucket, str(tmp_path / "missing.key"))
    with pytest.raises(delta.KeyFormatError, match="not a key: a key on a command line shows") as e:
        load_keys(bucket, old.secret_text())
    assert old.secret_text()[16:] not in str(e.value)
    assert os.environ["DELTA_SIGNING_KEY"] == new.secret_text()
