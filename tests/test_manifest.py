"""The manifest: JSON round trip, commit numbering that never overwrites, verified fetches."""

from __future__ import annotations

import pytest

from delta import DeltaFormatError, IntegrityError
from delta.bucket.manifest import (FileRef, Manifest, VersionEntry, fetch_verified, file_ref, manifest_path,
                                   read_manifest, version_of_path, write_manifest)
from delta.storage import open_storage


def h(version: int) -> str:
    return f"xxh3-128:{version:032x}"


def entry(version: int, kind: str = "delta") -> VersionEntry:
    d = FileRef(f"versions/{version:08d}-ab/delta-r00000.safetensors", 10, "0" * 64)
    a = FileRef(f"versions/{version:08d}-ab/anchor-r00000-00000-of-00001.safetensors", 10, "1" * 64)
    first = version == 1
    return VersionEntry(version, kind, None if first else version - 1, None if first else h(version - 1), h(version),
                        delta=() if first else (d,), anchor=(a,) if kind == "anchor" else ())


def test_round_trip_and_lookup():
    m = Manifest(0).with_version(entry(1, "anchor")).with_version(entry(2))
    back = Manifest.from_json(m.to_json())
    assert back == m and back.commit == 2 and back.latest.version == 2 and back.get(1).kind == "anchor"
    assert [a.version for a in back.anchors()] == [1]
    with pytest.raises(ValueError, match="does not follow"):
        m.with_version(entry(4))


def test_newest_parsable_manifest_wins_and_commits_never_overwrite(tmp_path):
    bucket = open_storage(tmp_path)
    assert read_manifest(bucket) is None
    first = write_manifest(bucket, Manifest(0).with_version(entry(1, "anchor")))
    bucket.write(manifest_path(first.commit + 1), b'{"format": "delta-weights-manif')  # a torn write
    assert read_manifest(bucket) == first
    second = write_manifest(bucket, first.with_version(entry(2)))
    assert second.commit == first.commit + 2  # above the torn file, which stays as it was
    assert read_manifest(bucket) == second
    with pytest.raises(DeltaFormatError, match="not valid JSON"):
        Manifest.from_json(bucket.read(manifest_path(first.commit + 1)))


def test_fetch_verified_detects_truncation_and_bit_flips(tmp_path):
    bucket = open_storage(tmp_path)
    ref = file_ref("versions/00000001-ab/x", b"hello world")
    bucket.write(ref.path, b"hello world")
    assert fetch_verified(bucket, ref) == b"hello world"
    bucket.write(ref.path, b"hello worl")
    with pytest.raises(IntegrityError, match="wrong size"):
        fetch_verified(bucket, ref)
    bucket.write(ref.path, b"hello worle")
    with pytest.raises(IntegrityError, match="SHA-256 mismatch"):
        fetch_verified(bucket, ref)
    assert version_of_path(ref.path) == 1 and version_of_path("manifests/0000000001.json") is None
