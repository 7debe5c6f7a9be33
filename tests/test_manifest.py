"""The manifest: JSON round trip, commit numbering that never overwrites, verified fetches."""

from __future__ import annotations

import json
import re
import time

import pytest

from delta import Bucket, DeltaFormatError, IntegrityError, read_manifest
from delta.bucket.manifest import (STATE_HASH, FileRef, Manifest, VersionEntry, fetch_verified, file_ref,
                                   manifest_path, version_of_path, write_manifest)


def h(version: int) -> str:
    return f"sum128:{version:032x}"


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
    bucket = Bucket.open(tmp_path)
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
    bucket = Bucket.open(tmp_path)
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


@pytest.mark.parametrize("raw, message", [
    (b'{"format": "delta-weights-manifest", "format_version": true, "commit": 1, "shards": null, "versions": []}',
     "manifest format version True is not supported"),
    (b'{"format": "delta-weights-manifest", "format_version": 3, "commit": 1e400, "shards": null, "versions": [], '
     b'"handovers": []}', "commit must be an integer in [0, 9223372036854775807], got inf"),
    (b'{"format": "delta-weights-manifest", "format_version": 3, "commit": 1, "shards": null, "versions": [5], '
     b'"handovers": []}', "versions[0] must be a JSON object, got 5"),
    (b'{"format": "delta-weights-manifest", "format_version": 3, "commit": NaN, "shards": null, "versions": []}',
     "manifest is not valid JSON (torn write?): 'NaN is not a JSON number'"),
    (b'{"format": "delta-weights-manifest", "format_version": 3, "commit": 1, "shards": [[1]], "versions": [], '
     b'"handovers": []}', "shards[0][0] must be a string of 1 to 1024 characters, got 1"),
    (b'{"format": "delta-weights-manifest", "format_version": 2, "commit": 1, "shards": null, "versions": []}',
     "manifest format version 2 is of a delta from before signed versions: a trainer on this bucket starts a new "
     "run with an anchor (format 3)"),
    (b'[' * 100_000 + b']' * 100_000, "manifest is not valid JSON"),
])
def test_fields_are_typed_and_errors_are_one_line(raw, message):
    with pytest.raises(DeltaFormatError) as e:
        Manifest.from_json(raw, path="manifests/0000000001.json")
    assert str(e.value) == f"manifests/0000000001.json: {message}" or message in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("field, value, message", [
    ("size", "123", "delta[0].size must be an integer"),
    ("size", 2**64, "delta[0].size must be an integer"),
    ("size", -1, "delta[0].size must be an integer"),
    ("size", 12.0, "delta[0].size must be an integer"),
    ("path", 5, "delta[0].path must be a string"),
    ("path", None, "delta[0].path must be a string"),
    ("path", "", "delta[0].path must be a string"),
    ("sha256", "AB" * 32, "delta[0].sha256 must be 64 lowercase hex digits"),
    ("rank", 1, "delta[0].rank must be an integer in [0, 0], got 1"),
])
def test_a_bad_file_entry_refuses_the_manifest_and_readers_keep_the_one_before(tmp_path, field, value, message):
    bucket = Bucket.open(tmp_path)
    good = write_manifest(bucket, Manifest(0).with_version(entry(1, "anchor")).with_version(entry(2)))
    body = json.loads(good.with_version(entry(3)).to_json())
    body["versions"][2]["delta"][0][field] = value
    bucket.write(manifest_path(good.commit + 1), json.dumps(body).encode())
    refused = []
    assert read_manifest(bucket, on_refused=refused.append) == good
    assert len(refused) == 1 and message in str(refused[0]) and "\n" not in str(refused[0])


def test_a_manifest_copied_under_another_commit_number_is_refused(tmp_path):
    bucket = Bucket.open(tmp_path)
    good = write_manifest(bucket, Manifest(0).with_version(entry(1, "anchor")))
    bucket.write(manifest_path(9), good.with_version(entry(2)).to_json())  # says commit 2
    refused = []
    assert read_manifest(bucket, on_refused=refused.append) == good
    assert "holds commit 2, its name says 9" in str(refused[0])


def test_state_hashes_are_of_the_one_scheme():
    assert STATE_HASH.fullmatch("sum128:" + "0" * 32)
    for bad in ("sum128:" + "0" * 31, "SUM128:" + "0" * 32, "sum128:" + "g" * 32, "xxh3-128:" + "0" * 32,
                "sum128:" + "0" * 32 + "\n", "\u202e:" + "0" * 32, "sum128:" + "0" * 33):
        assert not STATE_HASH.fullmatch(bad), bad


def test_what_a_manifest_lists_is_bounded_before_it_is_parsed(tmp_path):
    """A writer can list any number of handovers, ranks, pieces or files: more than a trainer can have is refused in
    one line, before any of them is parsed or any handover's signature checked, and readers keep the manifest
    before it. 20,000 handovers cost a reader ~16 s of signature checks at every poll."""
    from delta import SigningKey
    from delta.signing import make_handover

    MAX_HANDOVERS, MAX_RANKS = 16, 65_536  # as the run settings' handovers; a mesh larger than any trainer's

    bucket = Bucket.open(tmp_path)
    first = write_manifest(bucket, Manifest(0).with_version(entry(1, "anchor")))
    old = SigningKey.generate()
    one = make_handover(old, SigningKey.generate().public)
    body = json.loads(first.to_json())
    handover = {"old": one.old, "new": one.new, "signature": one.signature}
    kept = dict(body, handovers=[handover] * MAX_HANDOVERS)
    assert len(Manifest.from_json(json.dumps(kept).encode()).handovers) == MAX_HANDOVERS

    def two_ranks(versions: list) -> list:
        return [dict(v, delta=v["delta"] * 2) for v in versions]

    for changed, message in (
            ({"handovers": [handover] * (MAX_HANDOVERS + 1)},
             f"handovers: 17 key handovers, more than the {MAX_HANDOVERS} a manifest may hold"),
            ({"handovers": [handover] * 20_000}, "handovers: 20,000 key handovers, more than the 16 "),
            ({"shards": [[]] * (MAX_RANKS + 1)}, "shards: 65,537 ranks, more than the 65,536 a manifest may hold"),
            ({"versions": two_ranks(json.loads(write_manifest(bucket, Manifest(0).with_version(entry(1, "anchor"))
                                                              .with_version(entry(2))).to_json())["versions"])},
             r"versions\[1\].delta: 2 delta files \(one per rank\), more than the 1 a manifest may hold"),
            ({"pieces": {"w": {"shape": [4], "dim": 0, "slices": [["w@0:0", 0, 1]] * (MAX_RANKS + 1)}}},
             r"pieces\['w'\].slices: 65,537 slices, more than the 65,536 of one per rank"),
    ):
        commit = read_manifest(bucket).commit
        crafted = dict(body, commit=commit + 1, **changed)
        bucket.write(manifest_path(commit + 1), json.dumps(crafted).encode())
        refused = []
        start = time.perf_counter()
        assert read_manifest(bucket, on_refused=refused.append).commit == commit  # the one before
        assert time.perf_counter() - start < 2
        assert len(refused) == 1 and len(str(refused[0]).splitlines()) == 1
        assert re.search(f": {message}", str(refused[0])), refused[0]
