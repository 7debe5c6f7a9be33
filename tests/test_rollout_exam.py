"""A rollout server's exams against a real env, a real engine (tiny model) and a real bucket: due at version 0
and in each new block of versions, played on held-out secrets without examples, recorded to the bucket, never
handed in as a training group, and a failure that never stops the games for training."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import delta
from env_space.words import load_word_lists
from rollout_space.engines import Engine, EngineConfig, open_engine
from rollout_space.env_client import EnvClient
from rollout_space.exam import check_exam_games
from rollout_space.follower import Follower
from rollout_space.producer import GroupProducer
from rollout_space.service import RolloutService
from tests._engines import build_model
from tests._env_server import running_server
from tests.test_rollout_producer import NEVER, nudged, served
from tests.test_wire_exam import record
from tests.test_wire_fleet import run_settings
from trainer_space import TrainerConfig
from trainer_space.fleet import FleetRollouts, FleetRun
from wire.curriculum import ExampleSchedule
from wire.errors import RolloutError
from wire.exam import ExamRecord, ExamSettings
from fleet.exams import ExamShelf
from wire.fleet import RunSettings, RunState, ServerState
from fleet.bucket import FleetBucket
from fleet.liveness import GONE_AFTER_S
from wire.trajectory import Trajectory

HELD_OUT = set(load_word_lists().exam_secrets)
EXAM = ExamSettings(every=2, games=4, turns=2, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def env() -> str:
    with running_server("env") as url:
        yield url


@dataclass
class Server:
    """A rollout service following a bucket at version 1, producing for the run in it (`served`)."""

    publisher: delta.Publisher
    state: dict
    engine: Engine
    service: RolloutService
    producer: GroupProducer
    bucket: FleetBucket


@pytest.fixture()
def server(tmp_path, env: str) -> Iterator[Server]:
    publisher, state, engine, service, producer = served(tmp_path, env)
    try:
        yield Server(publisher, state, engine, service, producer, FleetBucket(publisher.storage.url))
    finally:
        publisher.close()
        service.close()


def with_exam(examples: ExampleSchedule = ExampleSchedule(mode="fixed")) -> RunSettings:
    run = run_settings()
    return run.model_copy(update={"exam": EXAM, "sampling": run.sampling.model_copy(update={"examples": examples})})


def test_an_exam_plays_held_out_words_without_examples_and_is_recorded(server: Server) -> None:
    publisher, state, engine, service = server.publisher, server.state, server.engine, server.service
    shelf, examiner = ExamShelf(publisher.storage.url), service.examiner
    assert examiner.due(with_exam(), 1)
    record = examiner.take(with_exam())
    assert record.version == engine.version == 1 and shelf.records() == [record]
    assert record.settings == EXAM and record.server_id == "s0" and record.state_hash is not None
    assert record.scores.games == 4 and record.scores.moves <= 8 and record.copying.own == 0
    assert record.copying.valid_rate == 1.0  # the reference: what copying the examples scores
    exam_games = [g for g in service.recent_games(10) if g.exam]
    assert len(exam_games) == 4 and all(not any(g.examples) for g in exam_games)
    assert {g.secret for g in exam_games if g.secret} <= HELD_OUT
    assert not examiner.due(with_exam(), 1)  # v1 examined: not due again in its block
    publisher.publish(nudged(state, 0))
    publisher.flush()
    service.follower.sync()
    assert engine.version == 2 and examiner.due(with_exam(), 2) and examiner.take(with_exam()).version == 2
    assert [r.version for r in shelf.records()] == [1, 2] and examiner.latest(1).version == 1
    assert not examiner.due(run_settings(), 2)  # a run without exams


def test_no_exam_game_is_ever_handed_in_or_trained_on(server: Server) -> None:
    """The producer's first batch goes before any exam (the trainer's first step never waits on it); the next look
    examines the weights held, then plays. The groups it writes hold training games only, none on a held-out word,
    and the trainer's rollout function takes exactly those."""
    bucket, service, producer = server.bucket, server.service, server.producer
    bucket.write_run(with_exam())
    producer.step()
    assert ExamShelf(bucket.bucket).records() == [] and len(bucket.list_groups()) == 2  # groups first
    bucket.delete([f.path for f in bucket.list_groups()])  # the trainer took them
    producer.step()
    assert [r.version for r in ExamShelf(bucket.bucket).records()] == [1]
    groups = [bucket.read_group(f.path) for f in bucket.list_groups()]
    games = [g for group in groups for g in group.games]
    assert len(groups) == 2 and games and not any(g.exam for g in games)
    assert not HELD_OUT & {g.secret for g in games}
    exam_ids = {g.episode_id for g in service.recent_games(20) if g.exam}
    assert len(exam_ids) == 4 and not exam_ids & {g.episode_id for g in games}
    config = TrainerConfig(bucket.url, None, "m", games_per_step=4, num_generations=2)
    run = FleetRun(config, bucket, run_id="run-1")
    taken = FleetRollouts(config, run, lambda: 1).take(2)
    trained = [g for group in taken for g in group.games]
    assert {g.episode_id for g in trained} == {g.episode_id for g in games}
    assert not exam_ids & {g.episode_id for g in trained}


def test_a_server_with_nothing_to_play_takes_the_exam_due_meanwhile(server: Server) -> None:
    """Back-pressure (enough groups wait in the bucket) leaves the server idle: the exam due is taken then."""
    bucket, producer = server.bucket, server.producer
    bucket.write_run(with_exam())  # room for 2 groups: one batch fills it
    producer.step()
    assert len(bucket.list_groups()) == 2 and ExamShelf(bucket.bucket).records() == []
    assert producer.step() > 0 and producer.state == ServerState.FULL
    assert [r.version for r in ExamShelf(bucket.bucket).records()] == [1] and len(bucket.list_groups()) == 2


def test_training_games_show_examples_by_the_runs_schedule(server: Server) -> None:
    bucket = server.bucket
    for mode, shown in (("off", False), ("fixed", True)):
        bucket.write_run(with_exam(ExampleSchedule(mode=mode)).model_copy(update={"exam": None}))
        server.producer.step()
        games = [g for f in bucket.list_groups() for g in bucket.read_group(f.path).games]
        assert games and all(all(bool(e) == shown for e in g.examples) for g in games), mode
        bucket.delete([f.path for f in bucket.list_groups()])


def test_a_failed_exam_is_retried_later_and_training_games_go_on(server: Server, monkeypatch) -> None:
    examiner, bucket, producer = server.service.examiner, server.bucket, server.producer
    examiner.env = EnvClient("http://127.0.0.1:9")  # an env that does not answer
    bucket.write_run(with_exam())
    producer.step()
    bucket.delete([f.path for f in bucket.list_groups()])
    producer.step()
    assert "EnvUnavailableError" in examiner.last_error and ExamShelf(bucket.bucket).records() == []
    assert len(bucket.list_groups()) == 2  # the batch for training was played all the same
    tries = []
    monkeypatch.setattr(examiner, "take", lambda run: tries.append(run))
    bucket.delete([f.path for f in bucket.list_groups()])
    producer.step()
    assert tries == [] and len(bucket.list_groups()) == 2  # not tried again before EXAM_RETRY_S; games go on


def test_exam_games_must_be_exam_games_without_examples_of_one_version() -> None:
    ok = Trajectory(prompt_ids=[1], episode_id="e", exam=True, examples=["", ""], versions=[3, 3])
    check_exam_games([ok], 3)
    for bad, why in ((ok.model_copy(update={"examples": ["", "crane"]}), "showed example words"),
                     (ok.model_copy(update={"exam": False}), "showed example words"),
                     (ok.model_copy(update={"versions": [3, 4]}), "played by versions")):
        with pytest.raises(RolloutError, match=why):
            check_exam_games([bad], 3)


def test_with_two_servers_one_examines_each_version_while_the_other_hands_in_groups(tmp_path, env: str,
                                                                                    monkeypatch) -> None:
    """The live server with the lowest id is the examiner: the other plays only training games, so one record per
    version and the fleet never stops producing all at once. When the examiner dies (its heartbeat gone, an exam
    left untaken), the other takes the exam that is still due."""
    clock = [1000.0]
    monkeypatch.setattr("fleet.liveness.time.monotonic", lambda: clock[0])
    publisher, state, engine, first, a = served(tmp_path, env)  # server s0, following the bucket at version 1
    url = publisher.storage.url
    other = open_engine("transformers", EngineConfig(str(tmp_path / "model"), dtype="bfloat16", max_model_len=4096))
    second = RolloutService(other, Follower(other, url, NEVER), EnvClient(env))
    b = second.attach_producer(FleetBucket(url), "s1", poll_s=0.05)
    bucket, shelf = FleetBucket(url), ExamShelf(url)

    def heartbeats(*producers: GroupProducer) -> None:
        for p in producers:
            bucket.write_heartbeat(p.heartbeat())
        for p in producers:
            p.peer_ids = p.live_peers()
            p.peers = len(p.peer_ids)

    def handed_in(server: str) -> int:
        return sum(1 for f in bucket.list_groups() if bucket.read_group(f.path).server_id == server)

    try:
        bucket.write_run(with_exam().model_copy(update={"max_pending_groups": 8}))
        a.step(), b.step()  # the first batches: no exam before them
        assert shelf.records() == [] and handed_in("s0") and handed_in("s1")
        assert a.peer_ids == b.peer_ids == []  # no heartbeat thread runs here: each said it works for the run at once
        bucket.delete([f.path for f in bucket.list_groups()])
        a.step(), b.step()  # who examines is judged on the heartbeats read at that moment
        assert a.peer_ids == ["s1"] and b.peer_ids == ["s0"] and a.examines() and not b.examines()
        assert [(r.version, r.server_id) for r in shelf.records()] == [(1, "s0")]
        assert handed_in("s0") and handed_in("s1")  # the examiner plays its batch after the exam
        assert not any(g.exam for g in second.recent_games(50))  # s1 played training games only
        for step in (0, 1):  # versions 2 and 3: a new block of `every` (2) versions
            publisher.publish(nudged(state, step))
        publisher.flush()
        clock[0] += GONE_AFTER_S + 1  # s0 died (mid-exam, say): its heartbeat stops counting up
        heartbeats(b)
        assert b.peer_ids == [] and b.examines()
        bucket.delete([f.path for f in bucket.list_groups()])
        b.step()  # holds version 1 (examined): catches up (to 2 or 3: the block of 2 and 3) and plays
        b.step()  # examines the version it holds, due in its block, in s0's place
        assert other.version in (2, 3)
        assert [(r.version, r.server_id) for r in shelf.records()] == [(1, "s0"), (other.version, "s1")]
        # s0 comes back while s1 plays the block's exam (its heartbeat says so; its record is not written yet): s0, the
        # lowest id, waits for that record instead of playing the same exam again
        written = shelf.records()[-1]
        bucket.delete([written.path])
        bucket.write_heartbeat(b.heartbeat().model_copy(update={"examining": written.version}))
        bucket.write_heartbeat(a.heartbeat())
        bucket.delete([f.path for f in bucket.list_groups()])
        a.step()
        assert a.peers_examining == ["s1"] and not a.examines() and handed_in("s0") and a.version() in (2, 3)
        assert [r.server_id for r in shelf.records()] == ["s0"]  # s0 took no exam meanwhile
        shelf.write(written)  # s1's exam is over, its record written and its heartbeat says so
        bucket.write_heartbeat(b.heartbeat())
        bucket.delete([f.path for f in bucket.list_groups()])
        a.step()
        assert a.peers_examining == [] and a.examines()  # s0 examines again, and the block's exam is s1's
        assert [(r.version, r.server_id) for r in shelf.records()] == [(1, "s0"), (written.version, "s1")]
    finally:
        publisher.close()
        first.close()
        second.close()


def test_an_exam_record_far_ahead_silences_no_exam(server: Server) -> None:
    """A stranger's `exams/v9999999999.json` (valid, signed alike) is ahead of every version the bucket published:
    refused, counted, and the exam due at the version held is taken all the same."""
    shelf = ExamShelf(server.bucket.bucket, server.bucket.key)
    far = ExamRecord.model_validate(record(version=9_999_999_999))
    shelf.write(far)
    assert server.service.examiner.due(with_exam(), 1)
    taken = server.service.examiner.take(with_exam())
    assert taken.version == server.engine.version == 1
    assert [r.version for r in shelf.records()] == [1] and shelf.refusals() == {"version ahead of the trainer": 1}
    assert server.service.examiner.latest().version == 1  # what the pages show as the last exam



@pytest.fixture()
def untrained(tmp_path, env: str) -> Iterator[Server]:
    """A rollout service on the untrained model (version 0: nothing published yet), producing for a run with exams,
    and the trainer's publisher, whose first version is 1."""
    model = build_model(str(tmp_path / "model"), seed=3)
    url = str(tmp_path / "bucket")
    state = delta.load_state(model)
    engine = open_engine("transformers", EngineConfig(model, dtype="bfloat16", max_model_len=4096))
    service = RolloutService(engine, Follower(engine, url, NEVER), EnvClient(env))
    producer = service.attach_producer(FleetBucket(url), "s0", poll_s=0.05)
    publisher = delta.Publisher(url, base_state=state)
    try:
        yield Server(publisher, state, engine, service, producer, FleetBucket(url))
    finally:
        publisher.close()
        service.close()


def first_step(server: Server) -> None:
    """The trainer takes the first batch, trains its first step and publishes version 1 (fetched, not loaded)."""
    server.bucket.delete([f.path for f in server.bucket.list_groups()])
    server.publisher.publish(nudged(server.state, 0))
    server.publisher.flush()
    server.service.follower.sync()  # from another thread than the producer's: fetches, and waits to load
    assert server.service.follower.latest == 1


def test_the_exam_of_version_0_waits_for_the_trainers_first_step_on_version_0(untrained: Server) -> None:
    """Played at once, the exam of the untrained policy would share the cores with the trainer's first step: it waits
    until version 1 is published, the server's batches meanwhile playing version 0 (kept, though version 1 is
    fetched), and is then of version 0; the server follows again after it."""
    bucket, producer, engine, shelf = untrained.bucket, untrained.producer, untrained.engine, ExamShelf(untrained.bucket.bucket)
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 2}))
    producer.step()  # the first batch, for the first step
    bucket.delete([f.path for f in bucket.list_groups()])  # the trainer took them: its first step begins
    producer.step()  # no exam yet: the next batch, of version 0
    assert shelf.records() == [] and {bucket.read_group(f.path).version for f in bucket.list_groups()} == {0}
    assert "waits for the trainer's first step" in untrained.service.examiner.activity()
    first_step(untrained)
    assert engine.version == 0  # kept for the exam
    producer.step()  # the exam of version 0, then version 1 loaded for the batch
    assert [r.version for r in shelf.records()] == [0] and engine.version == 1
    assert {bucket.read_group(f.path).version for f in bucket.list_groups()} == {1}
    assert untrained.service.examiner.activity() is None


def test_a_server_keeping_version_0_lets_it_go_at_its_next_look_once_another_server_examines(
        untrained: Server) -> None:
    """Issue 56: the examiner keeps version 0 for its exam; a server with a lower id joins and examines from then on.
    At its next look the first lets version 0 go (it used to keep it for good, and the trainer dropped its groups as
    too stale), then plays the trainer's versions, and takes no exam."""
    bucket, producer, engine = untrained.bucket, untrained.producer, untrained.engine
    examiner = untrained.service.examiner
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 2}))  # room for 2 groups: one batch fills it
    producer.step()
    assert producer.step() > 0 and producer.state == ServerState.FULL and examiner.kept
    bucket.write_heartbeat(producer.heartbeat().model_copy(update={"server_id": "a", "boot": "b00t"}))  # "a" < "s0"
    assert producer.step() > 0 and producer.state == ServerState.FULL
    assert not examiner.kept and examiner.activity() is None and producer.peer_ids == ["a"]
    first_step(untrained)  # the trainer takes the groups and publishes version 1
    assert producer.step() == 0 and engine.version == 1
    assert {bucket.read_group(f.path).version for f in bucket.list_groups()} == {1}
    assert ExamShelf(bucket.bucket).records() == []


def test_a_run_that_allows_no_stale_game_examines_version_0_before_its_second_batch(untrained: Server) -> None:
    bucket = untrained.bucket
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 0}))
    untrained.producer.step()
    bucket.delete([f.path for f in bucket.list_groups()])
    untrained.producer.step()
    assert [r.version for r in ExamShelf(bucket.bucket).records()] == [0]


def test_a_server_sharing_the_trainers_cores_lets_the_first_step_train_alone(untrained: Server) -> None:
    """`first_step_alone`: after the first batch nothing is played (waiting for step 1) until version 1 is
    published; then the exam of version 0 (the untrained policy), then the batches of version 1."""
    bucket, producer, engine = untrained.bucket, untrained.producer, untrained.engine
    producer.first_step_alone = True
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 2}))
    producer.step()
    bucket.delete([f.path for f in bucket.list_groups()])  # the trainer's first step begins
    assert producer.step() > 0 and producer.state == ServerState.WAITING and bucket.list_groups() == []
    first_step(untrained)
    assert producer.step() == 0 and producer.state == ServerState.PRODUCING
    assert [r.version for r in ExamShelf(bucket.bucket).records()] == [0] and engine.version == 1
    assert {bucket.read_group(f.path).version for f in bucket.list_groups()} == {1}


def test_a_server_waiting_for_the_first_step_plays_on_while_the_trainer_waits_for_more(untrained: Server,
                                                                                       monkeypatch) -> None:
    """The first step trains alone only once the trainer took every group: a first batch smaller than a step (the
    server's own --max-games) leaves groups in the bucket, and the server plays on; and it waits at most
    `FIRST_STEP_WAIT_S` (a trainer that refused the batch waits for more)."""
    bucket, producer = untrained.bucket, untrained.producer
    producer.first_step_alone, producer.max_games = True, 2  # one group of 2 games a batch; the step takes 2
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 2, "max_pending_groups": 4}))
    producer.step()
    assert producer.step() == 0 and producer.state == ServerState.PRODUCING and len(bucket.list_groups()) == 2
    bucket.delete([f.path for f in bucket.list_groups()])  # taken: the first step trains
    assert producer.step() > 0 and producer.state == ServerState.WAITING
    monkeypatch.setattr("rollout_space.choices.FIRST_STEP_WAIT_S", 0.0)  # the step has taken too long
    assert producer.step() == 0 and producer.state == ServerState.PRODUCING and len(bucket.list_groups()) == 1


def test_a_full_server_keeping_version_0_takes_its_exam_once_the_first_step_is_published(untrained: Server) -> None:
    """A trainer that publishes and takes no more groups (its last step done) leaves the server full: the exam of
    version 0 is taken there all the same, and the server follows again."""
    bucket, producer, engine = untrained.bucket, untrained.producer, untrained.engine
    bucket.write_run(with_exam().model_copy(update={"max_staleness": 2}))
    producer.step()  # the first batch fills the room: full from now on
    assert producer.step() > 0 and producer.state == ServerState.FULL
    untrained.publisher.publish(nudged(untrained.state, 0))
    untrained.publisher.flush()
    untrained.service.follower.sync()
    assert engine.version == 0 and producer.step() > 0 and producer.state == ServerState.FULL
    assert [r.version for r in ExamShelf(bucket.bucket).records()] == [0]
    untrained.service.follower.sync()
    assert engine.version == 1


def test_a_run_that_stops_before_the_exam_of_version_0_lets_version_0_go(untrained: Server) -> None:
    """A trainer that publishes its last step and stops (the run no longer running) leaves no exam to take: the
    version kept for the exam of version 0 is let go, and the server serves the trainer's last version."""
    bucket, producer, engine = untrained.bucket, untrained.producer, untrained.engine
    run = with_exam().model_copy(update={"max_staleness": 2})
    bucket.write_run(run)
    producer.step()
    producer.step()  # full: keeps version 0 for its exam
    untrained.publisher.publish(nudged(untrained.state, 0))
    untrained.publisher.flush()
    bucket.write_run(run.model_copy(update={"state": RunState.STOPPED}))
    assert producer.step() > 0 and producer.state == ServerState.PAUSED
    untrained.service.follower.sync()
    assert engine.version == 1 and untrained.service.examiner.activity() is None
