"""A rollout server's producer plays each batch with the newest weights in the bucket (the trainer takes a
step's groups right after publishing a version, so the room for the next batch and the version appear together),
and, beside other live servers of the run, its share of the room. Real engine (tiny model), real env server, real bucket; `GroupProducer.step` is the producer's one look."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from delta import SubscriberConfig, read_manifest
from rollout_space.engines import EngineConfig, open_engine
from rollout_space.env_client import EnvClient
from rollout_space.follower import Follower
from rollout_space.producer import GroupProducer
from rollout_space.service import RolloutService
from tests._engines import build_model, published
from tests._env_server import running_server
from tests.test_wire_fleet import run_settings
from wire.fleet import FleetMessageError, Heartbeat, RunState, ServerState
from fleet.bucket import FleetBucket
from fleet.liveness import GONE_AFTER_S, HeartbeatWatch
from wire.trajectory import Trajectory

#: The follower's own thread is never started, and would poll only hourly: what the producer plays with, it
#: loaded itself.
NEVER = SubscriberConfig(poll_interval=3600.0, max_backoff=3600.0)


@pytest.fixture(scope="module")
def env() -> str:
    with running_server("env") as url:
        yield url


def nudged(state: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """A trainer's next version: one weight changed."""
    out = dict(state)
    name = next(n for n in sorted(state) if state[n].is_floating_point())
    out[name] = state[name].clone()
    out[name].view(-1)[step] += 0.5
    return out


def served(tmp_path, env: str):
    """A publisher at version 1 (the model), and a rollout service following its bucket, producing for it."""
    model = build_model(str(tmp_path / "model"), seed=3)
    bucket = str(tmp_path / "bucket")
    state, publisher = published(model, bucket)
    engine = open_engine("transformers", EngineConfig(model, dtype="bfloat16", max_model_len=4096))
    service = RolloutService(engine, Follower(engine, bucket, NEVER), EnvClient(env))  # closes the client
    producer = service.attach_producer(FleetBucket(bucket), "s0", poll_s=0.05)
    FleetBucket(bucket).write_run(run_settings())
    return publisher, state, engine, service, producer


def test_a_batch_plays_the_version_published_since_the_last_one(tmp_path, env: str) -> None:
    publisher, state, engine, service, producer = served(tmp_path, env)
    try:
        assert engine.version == 1
        producer.step()
        first = FleetBucket(publisher.storage.url).list_groups()
        assert [FleetBucket(publisher.storage.url).read_group(f.path).version for f in first] == [1, 1]
        FleetBucket(publisher.storage.url).delete([f.path for f in first])  # the trainer took them
        publisher.publish(nudged(state, 0))
        publisher.flush()
        producer.step()
        groups = [FleetBucket(publisher.storage.url).read_group(f.path) for f in
                  FleetBucket(publisher.storage.url).list_groups()]
        assert engine.version == 2 and [g.version for g in groups] == [2, 2]
        assert all(game.versions and set(game.versions) == {2} for g in groups for game in g.games)
    finally:
        publisher.close()
        service.close()


def test_a_version_that_cannot_be_loaded_leaves_the_batch_playing_the_weights_held(tmp_path, env: str,
                                                                                caplog) -> None:
    publisher, state, engine, service, producer = served(tmp_path, env)
    try:
        publisher.publish(nudged(state, 0))
        publisher.flush()
        latest = read_manifest(publisher.storage).versions[-1]
        for ref in (*latest.delta, *latest.anchor):  # every route to version 2 torn
            with open(tmp_path / "bucket" / ref.path, "r+b") as f:
                f.truncate(ref.size // 2)
        assert producer.step() == 0.0
        groups = [FleetBucket(publisher.storage.url).read_group(f.path) for f in
                  FleetBucket(publisher.storage.url).list_groups()]
        assert engine.version == 1 and [g.version for g in groups] == [1, 1]
        assert "could not load the newest weights before a batch (playing version 1)" in caplog.text
    finally:
        publisher.close()
        service.close()


def test_with_other_servers_producing_each_plays_its_share_of_the_room(tmp_path, env: str, monkeypatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr("fleet.liveness.time.monotonic", lambda: clock[0])
    publisher, state, engine, service, producer = served(tmp_path, env)
    bucket = FleetBucket(publisher.storage.url)

    def beat(server: str, n: int, run: str = "run-1", state: ServerState = ServerState.PRODUCING) -> None:
        bucket.write_heartbeat(Heartbeat(server_id=server, boot="b", beat=n, run_id=run, state=state, version=1,
                                         games_per_min=1.0, groups_written=0, idle_share=0.5, updated_at=0.0))

    try:
        producer.step()  # alone: the whole room, two groups
        assert len(bucket.list_groups()) == 2 and producer.count_peers() == 0
        bucket.delete([f.path for f in bucket.list_groups()])
        beat("peer", 1)
        beat("other-run", 1, run="run-0")
        beat("paused", 1, state=ServerState.PAUSED)
        producer.peers = producer.count_peers()
        assert producer.peers == 1
        producer.step()  # with one peer: half the room
        assert len(bucket.list_groups()) == 1
        bucket.delete([f.path for f in bucket.list_groups()])
        clock[0] += GONE_AFTER_S + 1  # the peer went silent: gone, the room is this server's again
        producer.peers = producer.count_peers()
        producer.step()
        assert producer.peers == 0 and len(bucket.list_groups()) == 2
    finally:
        publisher.close()
        service.close()


def test_a_stranger_s_run_settings_never_make_a_server_play_more_than_its_own_caps(tmp_path) -> None:
    played: list[tuple[int, int, int | None]] = []

    def play(specs, params):
        played.append((len(specs), params.max_tokens, params.max_game_tokens))
        return [Trajectory(prompt_ids=[1], episode_id=f"e{i}", versions=[1]) for i in range(len(specs))]

    bucket = FleetBucket(str(tmp_path / "bucket"))
    producer = GroupProducer(play, lambda: 1, bucket, "s0", max_games=8, max_tokens=64)
    greedy = run_settings().model_copy(update={"num_generations": 64, "groups_per_step": 256,
                                               "max_pending_groups": 4096})
    bucket.write_run(greedy)
    with pytest.raises(FleetMessageError, match="asks for groups of 64 games of replies of 8 tokens; this server "
                                                "plays at most 8 games"):
        producer.step()
    bucket.write_run(greedy.model_copy(update={"num_generations": 4}))
    producer.step()
    assert played == [(8, 8, 512)]  # two groups of 4: the server's cap, not the run's 256 groups
    bucket.write_run(greedy.model_copy(update={"num_generations": 4, "sampling": greedy.sampling.model_copy(
        update={"max_tokens": 4096})}))
    with pytest.raises(FleetMessageError, match="replies of 4096 tokens"):
        producer.step()


def test_a_server_with_the_rollout_token_obeys_only_run_settings_signed_with_it(tmp_path) -> None:
    signed = FleetBucket(str(tmp_path / "bucket"), secret="rollout-token")
    producer = GroupProducer(lambda specs, params: [], lambda: 1, signed, "s0")
    FleetBucket(signed.bucket).write_run(run_settings())  # a stranger's, unsigned
    assert producer.step() > 0 and producer.state == ServerState.NO_RUN and producer.run_id is None
    assert "waiting for a run signed with this server's token" in producer.last_error
    assert "unsigned, and this run signs its files" in producer.last_error
    signed.write_run(run_settings(RunState.PAUSED))
    assert producer.step() > 0 and producer.state == ServerState.PAUSED
    assert producer.last_error is None  # the current trainer's run: nothing left to show


def test_a_previous_start_s_run_signed_with_another_token_waits_for_the_current_trainer(tmp_path) -> None:
    """A restart with another rollout token: the server reads the last start's run before the new trainer writes
    its own. It waits ("no run") instead of showing "forged" for good, and produces once the trainer has written."""
    bucket = str(tmp_path / "bucket")
    FleetBucket(bucket, secret="last-start-token").write_run(run_settings())
    played = []
    producer = GroupProducer(lambda specs, params: played.append(len(specs)) or [
        Trajectory(prompt_ids=[1], episode_id=f"e{i}", versions=[1]) for i in range(len(specs))], lambda: 1,
        FleetBucket(bucket, secret="this-start-token"), "s0")
    assert producer.step() > 0 and producer.state == ServerState.NO_RUN and played == []
    assert "signature does not match" in producer.last_error
    FleetBucket(bucket, secret="this-start-token").write_run(run_settings())
    assert producer.step() == 0 and producer.state == ServerState.PRODUCING and played
    assert producer.last_error is None and producer.heartbeat().last_error is None


def test_a_new_server_says_starting_and_a_new_version_is_beaten_at_once(tmp_path) -> None:
    """Before its first look at the run a server's heartbeat says "starting" (not "no run" at the v0 of weights not
    loaded yet); a version change is written within a poll, not at the next regular beat (an hour here)."""
    bucket = FleetBucket(str(tmp_path / "bucket"))
    version = [0]
    producer = GroupProducer(lambda specs, params: [], lambda: version[0], bucket, "s0", poll_s=0.05,
                             heartbeat_s=3600.0)
    assert producer.heartbeat().state == ServerState.STARTING

    def beaten(want: int) -> int | None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            seen = HeartbeatWatch(bucket).read()
            if seen and seen[0].heartbeat.version == want:
                return want
            time.sleep(0.05)
        return seen[0].heartbeat.version if seen else None

    producer.start()
    try:
        assert beaten(0) == 0
        version[0] = 4
        assert beaten(4) == 4
    finally:
        producer.close()


def test_a_server_looks_for_a_run_not_written_yet_soon_then_every_poll(tmp_path) -> None:
    """The trainer's first step waits for this server's first batch, which waits for the run: the first looks come
    within a few hundredths of a second of each other, then every `poll_s`."""
    producer = GroupProducer(lambda specs, params: [], lambda: 0, FleetBucket(str(tmp_path / "bucket")), "s0",
                             poll_s=1.0)
    waits = [producer.step() for _ in range(7)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0] and producer.state == ServerState.NO_RUN


def test_with_whole_shares_a_server_plays_its_share_of_a_step_whenever_there_is_room(tmp_path) -> None:
    """Where every write counts (the Hub), the room left a group at a time by a trainer that took a step's groups while
    the servers still filled it does not make a write a group: a server plays its whole share in one batch."""
    played: list[int] = []

    def play(specs, params):
        played.append(len(specs))
        return [Trajectory(prompt_ids=[1], episode_id=f"e{i}", versions=[1]) for i in range(len(specs))]

    for whole_shares, games, pending in ((False, 2, 2), (True, 4, 3)):  # groups of 2 games: one, or the step's two
        played.clear()
        bucket = FleetBucket(str(tmp_path / f"bucket-{whole_shares}"))
        bucket.write_run(run_settings())  # two groups a step, at most two pending
        producer = GroupProducer(play, lambda: 1, bucket, "s0", whole_shares=whole_shares)
        producer.step()
        bucket.delete([bucket.list_groups()[0].path])  # the trainer took one: room for one
        played.clear()
        assert producer.step() == 0
        assert played == [games] and len(bucket.list_groups()) == pending
        assert producer.step() > 0 and producer.state == ServerState.FULL  # over the bound: full, by a group at most


def test_a_restarted_server_says_starting_while_it_replays_the_bucket_s_versions(tmp_path) -> None:
    """A restarted server replays the bucket's deltas before its first batch (minutes on a CPU): its heartbeat said
    "producing" all along. It says "starting" until that first catch-up is over, then "producing" at once."""
    bucket = FleetBucket(str(tmp_path / "bucket"))
    bucket.write_run(run_settings())
    replaying, release = threading.Event(), threading.Event()

    def catch_up() -> None:
        replaying.set()
        release.wait(10)

    producer = GroupProducer(lambda specs, params: [Trajectory(prompt_ids=[1], episode_id=f"e{i}", versions=[5])
                                                    for i in range(len(specs))],
                             lambda: 5, bucket, "s0", heartbeat_s=3600.0, catch_up=catch_up)
    worker = threading.Thread(target=producer.step)
    worker.start()
    try:
        assert replaying.wait(10)
        assert producer.state == ServerState.STARTING
        assert [s.heartbeat.state for s in HeartbeatWatch(bucket).read()] == [ServerState.STARTING]
    finally:
        release.set()
        worker.join(10)
    assert producer.state == ServerState.PRODUCING and bucket.list_groups()  # its first batch, handed in
    assert [s.heartbeat.state for s in HeartbeatWatch(bucket).read()] == [ServerState.PRODUCING]
    producer.step()  # later batches catch up as ever, saying "producing"
    assert producer.state in (ServerState.PRODUCING, ServerState.FULL)
