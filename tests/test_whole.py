"""A version checked as a whole before anything of it is written (issue 37): multi-rank and pieced versions
whose manifest claims what their files cannot be (a tensor on two ranks, two files of one rank, a rank
beyond the world, a tensor both pieced and plain, pieces that do not tile), and manifests with fields of
the wrong JSON type, are refused in one line; a reader then stays on the good versions, holding exactly the
state whose hash it records. Real buckets written by two gloo ranks (`tests._ranked`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from delta import Bucket
import delta
from delta import DeltaFormatError, Manifest, Subscriber
from delta.bucket.manifest import manifest_commits
from delta.errors import printable

from ._ranked import RAW, STATES, forge, manifest_body, ranked_bucket
from ._states import states_equal
from ._capped import ROOT


@pytest.fixture(scope="module")
def buckets(tmp_path_factory):
    return {mode: ranked_bucket(tmp_path_factory.mktemp(mode) / "bucket", mode) for mode in ("names", "split")}


def _second_rank_file_claims_rank_0(b: dict) -> None:
    b["versions"][2]["delta"][1]["rank"] = 0


def _one_rank_and_a_file_of_rank_3(b: dict) -> None:
    b["shards"] = [b["shards"][0] + b["shards"][1]]
    for v in b["versions"]:
        for f in v["delta"] + v["anchor"]:
            f["rank"] = 0
    del b["versions"][2]["delta"][1]
    b["versions"][2]["delta"][0]["rank"] = 3


FORGED = {
    "a tensor on two ranks": ("names", lambda b: b["shards"][0].append(b["shards"][1][0]), "is held by two ranks"),
    "two files claim one rank": ("names", _second_rank_file_claims_rank_0, "delta files are of ranks [0, 0]"),
    "rank 3 of a one-rank version": ("names", _one_rank_and_a_file_of_rank_3, "2 delta files (one per rank), more than the 1"),
    "a rank's delta file missing": ("names", lambda b: b["versions"][2]["delta"].pop(), "one delta file per rank"),
    "an anchor without rank 1": ("names", lambda b: b["versions"][0]["anchor"].pop(), "anchor has no file of rank(s) [1]"),
    "a file listed twice": ("names", lambda b: b["versions"][0]["anchor"].append(b["versions"][0]["anchor"][0]),
                            "lists a file twice"),
    "pieced and plain": ("split", lambda b: b["shards"][0].append("layers.0.w"), "is both cut into pieces and held whole"),
    "a piece on two ranks": ("split", lambda b: b["shards"][1].append(b["shards"][0][0]), "is held by 2 ranks"),
    "an empty tensor without pieces": ("split", lambda b: b["pieces"]["head.fp32"].update(shape=[0], slices=[]),
                                       "no pieces"),
    "pieces that overlap": ("split", lambda b: b["pieces"]["layers.0.w"]["slices"][1].__setitem__(1, 200), "do not tile"),
    "a version of 1e400": ("names", lambda b: b["versions"][2].update(version=RAW + "1e400"),
                           "versions[2].version must be an integer"),
    "a path of 5": ("names", lambda b: b["versions"][2]["delta"][0].update(path=5), "path must be a string"),
    "a path that is a list": ("names", lambda b: b["versions"][2]["delta"][0].update(path=["a"]),
                              "path must be a string"),
    "a null path": ("names", lambda b: b["versions"][2]["delta"][0].update(path=None), "path must be a string"),
    "a size of '123'": ("names", lambda b: b["versions"][2]["delta"][0].update(size="123"), "size must be an integer"),
    "Arabic-Indic digits": ("names", lambda b: b["versions"][2].update(version="\u0663"), "version must be an integer"),
    "a bool for a rank": ("names", lambda b: b["versions"][2]["delta"][1].update(rank=True), "rank must be an integer"),
    "an escape in a state hash": ("names", lambda b: b["versions"][2].update(state_hash="xxh3-128:\x1b]0;owned\x07"),
                                  "state_hash must look like"),
    "a base that is not the version before": ("names", lambda b: b["versions"][2].update(base_version=1),
                                              "its base is version 1"),
}


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_forged_version_is_refused_and_the_reader_keeps_the_good_ones(buckets, tmp_path, case):
    mode, edit, message = FORGED[case]
    bucket = forge(buckets[mode], tmp_path / "bucket", edit)
    storage = Bucket.open(bucket)
    newest = manifest_commits(storage)[0][1]
    with pytest.raises(DeltaFormatError, match=re.escape(message)) as e:
        Manifest.from_json(storage.read(newest), path=newest)
    assert str(e.value).startswith(newest) and printable(str(e.value)) == str(e.value), str(e.value)
    for start in (None, 1):  # a new reader, and one that holds version 1
        state = {k: v.clone() for k, v in STATES[1].items()} if start else None
        with Subscriber(bucket, state, version=start) as reader:
            assert reader.sync() == 2
            assert "skipping a manifest" not in (reader.status().last_error or "")
            assert states_equal(reader.state, STATES[2])
            assert reader.digest.hexdigest == delta.state_digest(reader.state).hexdigest  # the same hash whole or in pieces


def test_a_name_the_state_lacks_refuses_the_step_in_one_line_and_the_reader_stays(buckets, tmp_path, caplog):
    bucket = forge(buckets["names"], tmp_path / "bucket", lambda b: b["shards"][1].append("ghost.w"))
    Manifest.from_json(Bucket.open(bucket).read(manifest_commits(Bucket.open(bucket))[0][1]))  # parses
    state = {k: v.clone() for k, v in STATES[1].items()}
    with Subscriber(bucket, state, version=1) as reader:
        with pytest.raises(delta.NoPathError, match="no usable route to version 3") as e:
            reader.sync()
        assert "\n" not in str(e.value)
        assert "rank 1's tensors in the manifest include 'ghost.w', which the state does not hold" in caplog.text
        assert reader.version == 1 and states_equal(reader.state, STATES[1])
        assert reader.digest.hexdigest == delta.state_digest(reader.state).hexdigest  # the same hash whole or in pieces


def _cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "delta", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in out.stderr, out.stderr
    for text in (out.stdout, out.stderr):
        assert all(c.isprintable() or c == "\n" for c in text), repr(text)
    return out


def test_delta_pull_and_log_say_in_one_line_which_manifest_they_skipped(buckets, tmp_path):
    bucket = forge(buckets["names"], tmp_path / "bucket", lambda b: b["versions"][2]["delta"][0].update(
        size=RAW + "1e400"))
    out = _cli("log", "--bucket", str(bucket))
    assert out.returncode == 0 and out.stderr == (
        "warning: skipping a manifest: manifests/0000000004.json: versions[2].delta[0].size must be an integer in "
        "[0, 9223372036854775807], got inf\n")
    assert [line.split()[0] for line in out.stdout.splitlines()[2:]] == ["1", "2"]
    out = _cli("pull", "--bucket", str(bucket), "-o", str(tmp_path / "o.st"))
    skipped, trusted = out.stderr.splitlines()  # and the key it trusts on first use, said once
    assert out.returncode == 0 and "skipping a manifest: manifests/0000000004.json: versions[2]" in skipped
    assert trusted.startswith("trusting SHA256:") and "trusted on first use (the key of version 1)" in trusted
    assert states_equal(delta.load_state(str(tmp_path / "o.st")), STATES[2])


def test_control_characters_in_a_path_reach_the_terminal_escaped(buckets, tmp_path):
    bad = "versions/\u202e\x9b31m\x1b]0;owned\x07.safetensors"
    bucket = forge(buckets["names"], tmp_path / "bucket", lambda b: b["versions"][2]["delta"][0].update(path=bad))
    out = _cli("pull", "--bucket", str(bucket), "-o", str(tmp_path / "o.st"))
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("error: no usable route to version 3")
    assert "\\u202e\\x9b31m\\x1b]0;owned\\x07" in out.stderr  # shown escaped, never run by the terminal
    assert not (tmp_path / "o.st").exists()


def test_the_real_manifests_pass(buckets):
    for bucket in buckets.values():
        body = manifest_body(bucket)
        assert Manifest.from_json(json.dumps(body).encode()).latest.version == 3
