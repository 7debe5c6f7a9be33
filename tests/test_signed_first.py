"""Nothing believed before its signature: a layout or a version a reader adopts comes from a signed entry it checked.

A stranger with write access to the bucket commits a manifest the trainer did not sign; the reader refuses it, and
neither its state's layout nor the version it names moves to what that manifest says."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import delta
from delta import Bucket, Publisher, Subscriber, UntrustedVersionError, read_manifest
from delta.bucket.manifest import MANIFEST_DIR
from delta.bucket.pieces import Sharded


def _commit(bucket: str, manifest: delta.Manifest) -> None:
    """Commit `manifest` as the bucket's next manifest, as any writer can."""
    storage = Bucket.open(bucket)
    storage.write(f"{MANIFEST_DIR}{manifest.commit:010d}.json", manifest.to_json())


def test_an_unsigned_layout_is_refused_before_the_state_is_laid_out_anew(tmp_path):
    bucket = str(tmp_path / "bucket")
    state = {"w": torch.randn(64, 4), "b": torch.randn(4)}
    with Publisher(bucket) as pub:
        pub.publish(state)
        assert pub.flush(timeout=60)
    with Subscriber(bucket) as sub:
        assert sub.sync() == 1
        held = {name: t.clone() for name, t in sub.state.items()}
        manifest = read_manifest(Bucket.open(bucket))
        # The stranger's layout: "w" in two pieces. The trainer's signature of version 1 covers the layout: now broken.
        layout = {"w": Sharded((64, 4), 0, (("w@0:0", 0, 32), ("w@0:32", 32, 64)))}
        _commit(bucket, replace(manifest, commit=manifest.commit + 1, pieces=layout,
                                shards=(("b", "w@0:0", "w@0:32"),)))
        with pytest.raises(UntrustedVersionError):
            sub.sync()
        assert sorted(sub.flat_state) == ["b", "w"]  # not re-laid into the stranger's pieces
        assert sub.version == 1 and sub.status().versions_refused == 1
        assert all(torch.equal(sub.state[n], held[n]) for n in held)
    # A reader given v1's state meets the forged layout at its first look: refused, it still reports its state's hash.
    with Subscriber(bucket, {n: t.clone() for n, t in held.items()}, version=1) as given:
        with pytest.raises(UntrustedVersionError):
            given.sync()
        assert given.version == 1 and given.digest is not None
        assert given.digest.hexdigest == delta.state_digest(given.state).hexdigest


def test_the_newest_version_a_reader_reports_is_one_the_trainer_signed(tmp_path):
    bucket = str(tmp_path / "bucket")
    v1 = {"w": torch.randn(64, 4)}
    with Publisher(bucket) as pub:
        for state in (v1, {"w": v1["w"] + 1}):
            pub.publish(state)
            assert pub.flush(timeout=60)
    with Subscriber(bucket) as sub:
        assert sub.sync(1) == 1
        status = sub.status()
        assert (status.version, status.latest, status.lag) == (1, 2, 1)  # signed by the key trusted on first use
        manifest = read_manifest(Bucket.open(bucket))
        # A writer without the trainer's key commits a version 3 after the trainer's 2.
        forged = replace(manifest.versions[-1], version=3, base_version=2, base_hash=manifest.latest.state_hash,
                         state_hash="sum128:" + "0" * 32)
        _commit(bucket, replace(manifest, commit=manifest.commit + 1, versions=manifest.versions + (forged,)))
        with pytest.raises(UntrustedVersionError):
            sub.sync()
        status = sub.status()
        assert status.version == 2 and status.versions_refused == 1
        assert (status.latest, status.lag) == (2, 0)  # not 3: that version is no version of the trainer's


def test_a_first_reader_trusts_no_strangers_key_for_the_layout_of_its_version(tmp_path):
    from delta.bucket.trust import sign_latest
    from delta.signing import SigningKey

    bucket = str(tmp_path / "bucket")
    v1 = {"w": torch.randn(64, 4), "b": torch.randn(4)}
    with Publisher(bucket) as pub:
        for state in (v1, {"w": v1["w"] + 1, "b": v1["b"]}):
            pub.publish(state)
            assert pub.flush(timeout=60)
    manifest = read_manifest(Bucket.open(bucket))
    # A stranger signs the trainer's version 2 again with a key of its own, under a layout of its own.
    layout = {"w": Sharded((64, 4), 0, (("w@0:0", 0, 32), ("w@0:32", 32, 64)))}
    forged = replace(manifest, commit=manifest.commit + 1, pieces=layout, shards=(("b", "w@0:0", "w@0:32"),))
    _commit(bucket, sign_latest(forged, SigningKey.generate(), manifest.versions[0].run or ""))
    with Subscriber(bucket) as sub:  # trust on first use, nothing held: version 1 is read first, and refused
        with pytest.raises(UntrustedVersionError):
            sub.sync()
        assert sub.trust.key is None and sub.state is None  # the stranger's key is not trusted for its layout
