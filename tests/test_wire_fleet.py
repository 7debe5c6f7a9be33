"""The fleet's messages through a real bucket: committed whole, checked on read, refused when damaged."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wire.fleet import (
    MAX_MESSAGE_BYTES, FleetMessageError, GameGroup, Heartbeat, RunSettings, RunState, Sampling, ServerState, decode,
    encode, group_path, group_run,
)
from wire.fleet_bucket import FleetBucket
from wire.trajectory import Trajectory


def game(version: int = 3, tokens: int = 4) -> Trajectory:
    return Trajectory(prompt_ids=[1, 2, 3], episode_id="e1", completion_ids=list(range(tokens)),
                      logprobs=[-0.5] * tokens, env_mask=[1] * tokens, reward=0.25, versions=[version, version + 1])


def group(run: str = "run-1", seq: int = 0, version: int = 3, games: int = 2) -> GameGroup:
    return GameGroup(run_id=run, server_id="srv-a", boot="b00t", seq=seq, seed=42,
                     games=[game(version) for _ in range(games)], played_s=1.5, created_at=time.time())


def run_settings(state: RunState = RunState.RUNNING) -> RunSettings:
    return RunSettings(run_id="run-1", state=state, num_generations=2, groups_per_step=2, max_staleness=1,
                       max_pending_groups=2, trainer_version=5, updated_at=time.time(),
                       sampling=Sampling(max_tokens=8, temperature=1.0, max_turns=3, reply_prefix="<guess>"))


def test_every_message_round_trips_through_a_local_bucket(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "bucket"))
    assert bucket.read_run() is None
    bucket.write_run(run_settings())
    assert bucket.read_run() == run_settings().model_copy(update={"updated_at": bucket.read_run().updated_at})
    g = group()
    path = bucket.write_group(g)
    assert path == "fleet/groups/run-1.srv-a.b00t.00000000.json" and group_run(path) == "run-1"
    assert [f.path for f in bucket.list_groups()] == [path]
    assert bucket.read_group(path) == g and bucket.read_group(path).version == 3
    beat = Heartbeat(server_id="srv-a", boot="b00t", beat=1, state=ServerState.FULL, version=3, games_per_min=2.0,
                     groups_written=1, idle_share=0.5, updated_at=time.time())
    bucket.write_heartbeat(beat)
    [f] = bucket.list_heartbeats()
    assert bucket.read_heartbeat(f.path) == beat


@settings(max_examples=30, deadline=None)
@given(seq=st.integers(0, 10**7), version=st.integers(0, 10**6), reward=st.floats(-5, 5), text=st.text(max_size=20))
def test_a_group_decodes_to_exactly_what_was_encoded(seq: int, version: int, reward: float, text: str) -> None:
    g = group(seq=seq, version=version)
    g = g.model_copy(update={"games": [g.games[0].model_copy(update={"reward": reward, "replies": [text]})] * 2})
    assert decode(encode(g), GameGroup) == g


def test_the_same_message_is_the_same_bytes() -> None:
    g = group()
    assert encode(g) == encode(GameGroup.model_validate(json.loads(json.dumps(g.model_dump(mode="json")))))


@pytest.mark.parametrize("damage, reason", [
    (lambda b: b[: len(b) // 2], "not whole JSON"),
    (lambda b: b.replace(b'"reward":0.25', b'"reward":9.25', 1), "does not match its sha256"),
    (lambda b: b"[]", "not a fleet message"),
    (lambda b: b.replace(b'"fleet-group/1"', b'"fleet-run/1"'), "kind 'fleet-run/1', expected 'fleet-group/1'"),
    (lambda b: b"\xff\xfe" + b, "not whole JSON"),
    (lambda b: b"[" * 100_000 + b"]" * 100_000, "not"),
])
def test_a_damaged_group_is_refused_with_what_is_wrong(damage, reason) -> None:
    with pytest.raises(FleetMessageError, match=reason):
        decode(damage(encode(group())), GameGroup, "g.json")


def _resealed(body: dict) -> bytes:
    """A crafted message whose hash matches its body: only the field checks can refuse it."""
    import hashlib

    raw = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"kind": "fleet-group/1", "sha256": hashlib.sha256(raw).hexdigest(), "body": body}).encode()


@pytest.mark.parametrize("edit, reason", [
    (lambda b: b["games"][0].update(logprobs=[0.0]), "invalid body: .*game 0: 4 completion tokens but 1 logprobs"),
    (lambda b: b["games"][0].update(versions=[]), "invalid body: .*game 0: no weight version"),
    (lambda b: b["games"][0].update(env_mask=[1, 1, 1, 7]), "invalid body: .*game 0: env_mask holds"),
    (lambda b: b.update(run_id="../../etc"), "invalid run_id: String should match pattern"),
    (lambda b: b.update(extra="x"), "invalid extra: Extra inputs are not permitted"),
    (lambda b: b.update(games=[]), "invalid games: List should have at least 1 item"),
])
def test_a_crafted_group_with_a_valid_hash_is_refused_by_its_fields(edit, reason) -> None:
    body = group().model_dump(mode="json")
    edit(body)
    with pytest.raises(FleetMessageError, match=reason):
        decode(_resealed(body), GameGroup, "g.json")


def test_a_file_renamed_by_hand_is_refused(tmp_path: Path) -> None:
    bucket = FleetBucket(str(tmp_path / "bucket"))
    data = encode(group(seq=1))
    bucket.storage.write(group_path("run-1", "srv-a", "b00t", 2), data)
    with pytest.raises(FleetMessageError, match="renamed or copied"):
        bucket.read_group(group_path("run-1", "srv-a", "b00t", 2))


def test_an_oversized_message_is_refused_before_it_is_parsed() -> None:
    with pytest.raises(FleetMessageError, match="more than"):
        decode(b" " * (MAX_MESSAGE_BYTES + 1), GameGroup)
