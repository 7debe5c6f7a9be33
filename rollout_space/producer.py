"""The rollout server's side of the fleet: play groups of games continuously and hand them in through the bucket
(`fleet.bucket`), so the trainer never waits on one server and needs no address of any.

`GroupProducer` reads the run's settings and, while it runs, plays batches of groups (`num_generations` games on one
seed) with whatever weights the follower has loaded; each group is one file, committed whole. It stops while the run
is paused or stopped, or while `max_pending_groups` of its groups wait (back-pressure), and plays its share of the
room beside the other live servers (on the Hub, `whole_shares`: its share of a step, in one write). What it does at
each look is `choices.choose`'s; the live server with the lowest id takes the exams. A heartbeat thread writes the
server's state and reads the others'. Killed at any moment, a server loses only the batch it was playing."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from delta import DeltaError, StorageError
from delta.storage import RetryPolicy
from fleet.bucket import FleetBucket
from fleet.liveness import HeartbeatWatch
from wire.errors import RolloutError
from wire.fleet import (
    RUN_PATH,
    FleetMessageError,
    GameGroup,
    Heartbeat,
    Refusal,
    RunSettings,
    RunState,
    ServerState,
    group_run,
)
from wire.lora import LoraSettings
from wire.trajectory import Trajectory

from .choices import Choice, Exam, Known, Look, choose
from .engines.errors import EngineError
from .exam import Examiner
from .games import GameSpec, PlayParams

logger = logging.getLogger(__name__)

#: Seconds of history behind `games_per_min`.
RATE_WINDOW_S = 300.0
#: The first wait for a run to appear, doubled at each look up to `poll_s`: a server usually starts before its
#: trainer writes the run, and its first batch is what the trainer's first step waits for.
FIRST_LOOK_S = 0.05
#: What goes wrong in an exam, or in reading the records for one: logged, tried again later (`choices.EXAM_RETRY_S`).
EXAM_ERRORS = (OSError, StorageError, RolloutError)


@dataclass
class _RunMemory:
    """What this server remembers of one run between its looks (`choices.Known` is made of it); a new run starts
    afresh."""

    run_id: str
    announced: bool = False  # said at once that it works for the run (`_announce`)
    first_batch_at: float | None = None  # when it handed in its first batch for the run (monotonic)
    full_at: tuple[int, int | None] | None = None  # (held, published) when it last chose while full
    exam_failed_at: float | None = None  # when an exam for the run last failed (monotonic)


def server_id_from(text: str) -> str:
    """A valid server id from any text (a host name, a Space id): other characters become '-'."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "-", text).strip("-_")[:64]
    return cleaned or "rollout"


class GroupProducer:
    """Plays and writes game groups while the run asks for them. Threads: a producer and a heartbeat.

    Args:
        play: Plays whole games with the current policy (`RolloutService.play`, trainer priority).
        version: The weight version served now.
        bucket: The fleet's bucket; its budget gives every interval left None.
        server_id: This server's name in the fleet (its heartbeat file).
        poll_s: Seconds between looks at the run while there is nothing to play.
        whole_shares: Play a whole share of a step whenever the bucket has room, not a share of the room left.
        heartbeat_s, gone_after_s: Seconds between heartbeats; of silence after which a peer counts as gone.
        beat_on_version: One more heartbeat whenever the version served changes.
        catch_up: Loads the newest published weights before each batch (`Follower.sync`); a failure is logged.
        max_games, max_tokens: The server's own caps: a run's settings never make it play more.
        published: The newest version the bucket has published (`Follower.latest`).
        first_step_alone: After the first batch for a run, play nothing until `published` is 1 or more (a server
            sharing the trainer's cores would double that step), at most `choices.FIRST_STEP_WAIT_S`.
        adopt: Called with the run's LoRA settings and its staleness + 1 at each read (`Follower.adopt`); what it
            raises is a failure, and nothing is played.
        examiner: Takes the exams the run asks for (one server per run). None: no exams.

    Attributes:
        state, last_error: What it does now, and the last failure until a batch is handed in.
        groups_written, games_written: Since it started.
        peers, peer_ids: The other servers producing for the run, at the last heartbeat.
    """

    def __init__(
        self,
        play: Callable[[Sequence[GameSpec], PlayParams], list[Trajectory]],
        version: Callable[[], int],
        bucket: FleetBucket,
        server_id: str,
        *,
        poll_s: float | None = None,
        whole_shares: bool | None = None,
        heartbeat_s: float | None = None,
        gone_after_s: float | None = None,
        beat_on_version: bool | None = None,
        catch_up: Callable[[], object] | None = None,
        examiner: Examiner | None = None,
        max_games: int = 256,
        max_tokens: int = 1024,
        adopt: Callable[[LoraSettings | None, int], object] | None = None,
        published: Callable[[], int | None] = lambda: None,
        first_step_alone: bool = False,
    ) -> None:
        self.play = play
        self.published = published
        self.first_step_alone = first_step_alone
        self.adopt = adopt
        self.max_games = max_games
        self.max_tokens = max_tokens
        self.catch_up = catch_up
        self.examiner = examiner
        self.version = version
        self.bucket = bucket
        self.server_id = server_id
        self.boot = uuid.uuid4().hex[:8]
        budget = bucket.budget
        poll_s = budget.poll_s if poll_s is None else poll_s
        self.poll_s = poll_s
        self.whole_shares = budget.whole_shares if whole_shares is None else whole_shares
        self.heartbeat_s = budget.heartbeat_s if heartbeat_s is None else heartbeat_s
        self.beat_on_version = budget.beat_on_version if beat_on_version is None else beat_on_version
        self._look_s = min(FIRST_LOOK_S, poll_s)  # the next wait for a run not written yet
        self.state = ServerState.STARTING
        self.run_id: str | None = None
        self.last_error: str | None = None
        self.groups_written = 0
        self.games_written = 0
        self._seq = 0
        self._beat = 0
        self._started = time.monotonic()
        self._busy_s = 0.0
        self._written: deque[tuple[float, int]] = deque()  # (monotonic time, games) per batch written
        self._rng = random.SystemRandom()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures = 0
        self._run_refused: str | None = None  # the last_error a run signed with another key set (cleared by a good one)
        self._retry = RetryPolicy(None, poll_s, 30.0)
        self._watch = HeartbeatWatch(bucket, budget.gone_after_s if gone_after_s is None else gone_after_s)
        self.peers = 0
        self.peer_ids: list[str] = []
        self.peers_examining: list[str] = []  # the peers whose last heartbeat said an exam plays there now
        self._examining: int | None = None  # the version whose exam this server plays now (its heartbeat says so)
        self._memory: _RunMemory | None = None  # of the run it last read
        self._followed = False  # the first catch-up with the bucket since this server started is over
        self._beat_lock = threading.Lock()  # one heartbeat written, or the others' read, at a time

    def start(self) -> GroupProducer:
        self._threads = [
            threading.Thread(target=self._produce, name="fleet-producer", daemon=True),
            threading.Thread(target=self._heartbeats, name="fleet-heartbeat", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        """Ask both threads to stop, without waiting (a batch in flight ends when the engine is interrupted
        or finishes)."""
        self._stop.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop both threads and wait for them."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout)

    # -- what the heartbeat says -----------------------------------------------------------------------

    def games_per_min(self) -> float:
        now = time.monotonic()
        while self._written and now - self._written[0][0] > RATE_WINDOW_S:
            self._written.popleft()
        span = min(RATE_WINDOW_S, now - self._started)
        return 60.0 * sum(n for _, n in self._written) / span if span > 0 else 0.0

    def idle_share(self) -> float:
        elapsed = time.monotonic() - self._started
        return max(0.0, 1.0 - self._busy_s / elapsed) if elapsed > 0 else 1.0

    def heartbeat(self) -> Heartbeat:
        self._beat += 1
        trust = self.bucket.trust  # the weights' and the run settings' (one per bucket): shown on the trainer's page
        return Heartbeat(
            server_id=self.server_id,
            boot=self.boot,
            beat=self._beat,
            run_id=self.run_id,
            state=self.state,
            version=self.version(),
            games_per_min=self.games_per_min(),
            groups_written=self.groups_written,
            idle_share=self.idle_share(),
            last_error=self.last_error[:2000] if self.last_error else None,
            updated_at=time.time(),
            authenticated=not trust.unauthenticated,
            trusted_key=trust.key.fingerprint if trust.key is not None else None,
            examining=self._examining,
        )

    # -- the threads -----------------------------------------------------------------------------------

    def _heartbeats(self) -> None:
        """A heartbeat every `heartbeat_s`, and with `beat_on_version` one as soon as the version served changes."""
        written, due = None, 0.0
        while True:
            version = self.version()
            if (self.beat_on_version and version != written) or time.monotonic() >= due:
                self._write_heartbeat()
                self._read_peers()
                written, due = version, time.monotonic() + self.heartbeat_s
            if self._stop.wait(min(self.poll_s, self.heartbeat_s)):
                return

    def _write_heartbeat(self) -> None:
        """Write this server's heartbeat now (either thread); a failure is logged."""
        try:
            with self._beat_lock:
                self.bucket.write_heartbeat(self.heartbeat())
        except (OSError, StorageError) as e:
            logger.warning("could not write this server's heartbeat: %s", e)

    def _read_peers(self) -> None:
        """Read the other servers' heartbeats into `peer_ids`, `peers` and `peers_examining` (either thread); on a
        failure they stay as they were, and it is logged."""
        try:
            with self._beat_lock:
                beats = self._live_beats()
                self.peer_ids = [b.server_id for b in beats]
                self.peers_examining = [b.server_id for b in beats if b.examining is not None]
            self.peers = len(self.peer_ids)
        except (OSError, StorageError) as e:
            logger.warning("could not read the other servers' heartbeats: %s", e)

    def live_peers(self) -> list[str]:
        """The ids of the other live servers working for this server's run (producing, full, waiting, or starting with
        the run read), sorted; none before it knows the run."""
        return [b.server_id for b in self._live_beats()]

    def _live_beats(self) -> list[Heartbeat]:
        if self.run_id is None:
            return []
        return sorted(
            (
                s.heartbeat
                for s in self._watch.read()
                if not s.gone
                and s.heartbeat.server_id != self.server_id
                and s.heartbeat.run_id == self.run_id
                and s.heartbeat.state
                in (ServerState.STARTING, ServerState.PRODUCING, ServerState.FULL, ServerState.WAITING)
            ),
            key=lambda b: b.server_id,
        )

    def count_peers(self) -> int:
        """How many other live servers produce for this server's run (`live_peers`)."""
        return len(self.live_peers())

    def examines(self) -> bool:
        """Whether this server is the run's examiner: the live server of the run with the lowest id, as the last
        heartbeats said. Every server comes to the same answer through the bucket alone; when the examiner's heartbeat
        is gone, the next one takes the exam over. None examines while another says an exam plays there: an examiner
        that comes back (a restart) waits for the record of the exam its stand-in plays, not plays it again."""
        if self.peers_examining:
            return False
        return not self.peer_ids or self.server_id < self.peer_ids[0]

    def _produce(self) -> None:
        while not self._stop.is_set():
            try:
                wait = self.step()
            except (OSError, StorageError, RolloutError, EngineError, FleetMessageError) as e:
                if self._stop.is_set():  # the engine was closed under the batch: the server is stopping
                    return
                wait = self._failed(e)
            except Exception as e:  # an engine or env failure must not end production for good
                logger.exception("producing games failed")
                wait = self._failed(e)
            if wait:
                self._stop.wait(wait)

    def _failed(self, error: Exception) -> float:
        self._failures += 1
        self.state = ServerState.ERROR
        self.last_error = f"{time.strftime('%H:%M:%S')} {type(error).__name__}: {error}"
        wait = self._retry.delay_after(error, self._failures)  # a rate limit: until the time the bucket named
        logger.warning("producing games failed (%d in a row), retrying in %.1f s: %s", self._failures, wait, error)
        return wait

    def step(self) -> float:
        """Look at the run once, choose what to do (`choices.choose`) and do it: play and write one batch of groups
        if the run asks for them. Returns the seconds to wait before the next look (0 after a batch)."""
        try:
            run = self.bucket.read_run()  # run settings the trainer did not sign: its last ones it did, if any
        except FleetMessageError as e:
            if e.category not in (Refusal.UNSIGNED, Refusal.UNTRUSTED):
                raise
            # A run signed with another key: a previous start's (with another rollout token) until the current
            # trainer writes its own, or a stranger's. Not an error of this server: wait for a run it can trust.
            whose = "this server's token" if e.category == Refusal.UNSIGNED else "the trainer's key"
            self.last_error = self._run_refused = (
                f"{time.strftime('%H:%M:%S')} waiting for a run signed with {whose}: {e}"
            )
            return self._no_run(self.poll_s)
        if self._run_refused is not None and self.last_error == self._run_refused:
            self.last_error = None  # the current trainer wrote its run: the wait is over, not an error to show
        self._run_refused = None
        if run is None:
            wait, self._look_s = self._look_s, min(self.poll_s, 2 * self._look_s)
            return self._no_run(wait)
        self.run_id = run.run_id
        if self._memory is None or self._memory.run_id != run.run_id:
            self._memory = _RunMemory(run.run_id)
        memory = self._memory
        if self.adopt is not None:  # the state the run publishes (a LoRA adapter, merged weights): before any game
            self.adopt(run.lora, run.max_staleness + 1)
        pending = 0
        if run.state == RunState.RUNNING:
            if run.num_generations > self.max_games or run.sampling.max_tokens > self.max_tokens:
                raise FleetMessageError(
                    RUN_PATH,
                    f"the run asks for groups of {run.num_generations} games of replies "
                    f"of {run.sampling.max_tokens} tokens; this server plays at most "
                    f"{self.max_games} games (--max-games) of {self.max_tokens} tokens "
                    "(--max-tokens): not playing it",
                )
            pending = sum(1 for f in self.bucket.list_groups() if group_run(f.path) == run.run_id)
        known = self._known(run, memory, pending)
        choice = choose(known)
        # A server just started or restarted first loads what the bucket holds (replaying its deltas can take
        # minutes): it still says "starting", and shows no version, until that first catch-up is over.
        replaying = not self._followed and choice.state == ServerState.PRODUCING
        self.state = ServerState.STARTING if replaying else choice.state
        if choice.state in (ServerState.PRODUCING, ServerState.FULL, ServerState.WAITING):
            self._announce(memory)
        choice = self._looked(run, memory, known, choice)
        if choice.state == ServerState.FULL:
            memory.full_at = (known.held, known.published)
        self._carry_out(choice.exam, run, memory)
        if choice.state != ServerState.PRODUCING:
            return self.poll_s
        self._catch_up()
        if replaying:
            self._followed = True
            self.state = choice.state
            self._write_heartbeat()  # producing now, said at once (not at the next beat)
        shared = run.groups_per_step if self.whole_shares else run.max_pending_groups - pending  # a step, or the room
        groups = min(run.groups_per_step, -(-shared // (1 + self.peers)), self.max_games // run.num_generations)
        if self._play_batch(run, groups) and memory.first_batch_at is None:
            memory.first_batch_at = time.monotonic()
        if self._failures:  # a batch handed in: an earlier failure is over (the heartbeat shows only what holds now)
            self.last_error = None
        self._failures = 0
        return 0.0

    def _no_run(self, wait: float) -> float:
        """No run this server trusts: nothing to play; `wait` is returned."""
        self.run_id = None
        choice = choose(Known(None, kept=self.examiner is not None and self.examiner.kept))
        self.state = choice.state
        self._carry_out(choice.exam)
        return wait

    def _known(self, run: RunSettings, memory: _RunMemory, pending: int) -> Known:
        """What this server knows of `run` now, before any look at the heartbeats or the exam records."""
        return Known(
            run.state,
            now=time.monotonic(),
            pending=pending,
            max_pending=run.max_pending_groups,
            first_batch_at=memory.first_batch_at,
            first_step_alone=self.first_step_alone,
            held=self.version(),
            published=self.published(),
            exams=self.examiner is not None and run.exam is not None,
            max_staleness=run.max_staleness,
            kept=self.examiner is not None and self.examiner.kept,
            exam_failed_at=memory.exam_failed_at,
            full_at=memory.full_at,
        )

    def _looked(self, run: RunSettings, memory: _RunMemory, known: Known, choice: Choice) -> Choice:
        """Read what `choice` asks for (each look answers its question, so this ends) and choose again."""
        while choice.look is not None:
            if choice.look == Look.PEERS:  # judged on heartbeats read now, not a beat ago
                self._read_peers()
                known = replace(known, examines=self.examines())
            else:
                assert self.examiner is not None  # no exam is looked for without one (`Known.exams`)
                try:
                    known = replace(known, due=self.examiner.due(run, known.held))
                except EXAM_ERRORS as e:
                    known = replace(known, exam_failed_at=self._exam_failed(memory, e))
            choice = choose(known)
        return choice

    def _carry_out(self, exam: Exam, run: RunSettings | None = None, memory: _RunMemory | None = None) -> None:
        """Do what was chosen about the exam (TAKE is chosen only for a run, with an examiner)."""
        examiner = self.examiner
        if examiner is None or exam == Exam.NONE:
            return
        if exam == Exam.KEEP:
            examiner.keep()
        elif exam == Exam.LET_GO:
            examiner.let_go()
        else:
            assert run is not None and memory is not None
            self._examining = self.version()
            self._write_heartbeat()  # said before it plays: a server that would examine meanwhile waits for the record
            try:
                examiner.take(run)
            except EXAM_ERRORS as e:
                self._exam_failed(memory, e)
            finally:
                examiner.let_go()  # the exam of version 0 taken (or failed): follow again
                self._examining = None
                self._write_heartbeat()

    def _exam_failed(self, memory: _RunMemory, error: Exception) -> float:
        """Note a failed exam; returns its time (the next try waits `choices.EXAM_RETRY_S`)."""
        assert self.examiner is not None
        self.examiner.failed(error)
        memory.exam_failed_at = time.monotonic()
        return memory.exam_failed_at

    def _announce(self, memory: _RunMemory) -> None:
        """The first time this server works for the run, say so at once (a heartbeat now, not at the next beat): the
        other servers then count it when they decide who examines."""
        if not memory.announced:
            memory.announced = True
            self._write_heartbeat()

    def _catch_up(self) -> None:
        if self.catch_up is None:
            return
        try:
            self.catch_up()
        except (DeltaError, OSError) as e:  # the follower keeps trying in its own thread; play what is held
            logger.warning(
                "could not load the newest weights before a batch (playing version %d): %s", self.version(), e
            )

    def _play_batch(self, run: RunSettings, groups: int) -> bool:
        """Play `groups` groups and hand them in; False if the run changed meanwhile (nothing handed in)."""
        seeds = [self._rng.randrange(2**31 - 1) for _ in range(groups)]
        specs = [GameSpec(seed=s) for s in seeds for _ in range(run.num_generations)]
        s = run.sampling
        params = PlayParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            max_turns=s.max_turns,
            reply_prefix=s.reply_prefix,
            max_game_tokens=run.max_game_tokens,
            examples=s.examples.probability(self.version()),
        )
        start = time.monotonic()
        try:
            games = self.play(specs, params)
        finally:
            self._busy_s += time.monotonic() - start
        played_s = time.monotonic() - start
        now = self.bucket.read_run()
        if now is None or now.run_id != run.run_id:  # a new trainer run started meanwhile: these games are not its
            logger.info("the run changed while a batch played: %d games left unwritten", len(games))
            return False
        g = run.num_generations
        batch = [
            GameGroup(
                run_id=run.run_id,
                server_id=self.server_id,
                boot=self.boot,
                seq=self._seq + i,
                seed=seed,
                games=games[i * g : (i + 1) * g],
                played_s=played_s,
                created_at=time.time(),
            )
            for i, seed in enumerate(seeds)
        ]
        self._seq += len(batch)  # taken even if the write fails: a group's path is never written twice
        self.bucket.write_groups(batch)  # one request for the batch (the Hub counts each)
        for group in batch:
            logger.info("wrote group %s (%d games, version %d)", group.path, g, group.version)
        self.groups_written += len(batch)
        self.games_written += len(batch) * g
        self._written.append((time.monotonic(), groups * g))
        return True
