"""The trainer's side of the fleet: rollout servers coordinated only through the bucket (`fleet.bucket`).

`FleetRun` writes the run's settings at every change of the session's state; the servers produce groups while the
run runs and fewer than `max_pending_groups` wait in the bucket. `FleetRollouts` is GRPOTrainer's `rollout_func`:
each step it takes the oldest complete groups, whoever wrote them. A group more than `max_staleness` versions behind
the trainer is dropped and counted; the rest is corrected for being off-policy (`offpolicy`). Files of another run,
torn, crafted, unsigned, too large, or not fitting the run (`wire.fleet_checks`) are refused by reason, never
trained on. What the trainer took, dropped or refused it deletes, and remembers, so no group is used twice; the
groups held are bounded in number and size whatever the bucket holds. `FleetMonitor` reads the heartbeats."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from delta import StorageError, StoredFile
from fleet.bucket import FleetBucket
from fleet.liveness import HeartbeatWatch, SeenServer
from fleet.periodic import Periodic
from wire.fleet import FleetMessageError, GameGroup, Refusal, RunSettings, RunState, Sampling, group_run
from wire.fleet_checks import check_group, max_group_bytes
from wire.lora import LoraSettings
from wire.trainer import FleetServer
from wire.trajectory import Trajectory

from .config import TrainerConfig
from .credit import move_chooser
from .ranks import TrainerRanks
from .rollouts import RolloutsStopped, trajectory_columns
from .staleness import StalenessCounts, StepRollouts, examples_scheduled, examples_shown, straddled

logger = logging.getLogger(__name__)

#: Seconds between two looks at the bucket while a step waits for groups: the first look again after
#: `FIRST_POLL_S`, then twice as long each time, up to the bucket's budget's `group_wait_s` (0.5 s on a
#: folder or S3, 5 s on a Hub bucket). An idle trainer costs more than a listing, and most waits end soon after they
#: start (a server writes its batch as the step needs it), so the first looks are quick; a long wait (no server)
#: costs a listing every `group_wait_s`.
FIRST_POLL_S = 0.02
#: Seconds after which a gone server's heartbeat file is deleted.
FORGET_AFTER_S = 3600.0


def new_run_id() -> str:
    """A fresh run id: the time it started and a random part, so runs sort by start."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


class FleetRun:
    """Writes the run's settings for one trainer process (a new process is a new run, `run_id`); a step takes
    `groups_per_step` groups for each of `ranks`."""

    def __init__(self, config: TrainerConfig, bucket: FleetBucket, run_id: str | None = None, ranks: int = 1) -> None:
        self.config = config
        self.ranks = ranks
        self.bucket = bucket
        self.run_id = run_id or new_run_id()
        self.state = RunState.STOPPED
        self.version = 0
        self.vocab_size: int | None = None  # the model's, once loaded (`know_vocabulary`)
        self.lora: LoraSettings | None = None  # a LoRA run's, once the model is loaded (`know_lora`)
        #: The run before this one on the bucket: its LoRA settings, read before this run writes its own
        #: (`read_previous`: a LoRA run resumes only an adapter trained with the same settings on the same base; a run
        #: of every weight refuses an adapter run's versions in one line).
        self.previous_lora: LoraSettings | None = None
        self.sent = False
        self.unsent = False
        self.last_error: str | None = None

    def read_previous(self) -> None:
        """Read the run before this one (`previous_lora`), before this run writes its own settings."""
        try:
            before = self.bucket.read_run()
        except (OSError, StorageError, FleetMessageError) as e:
            logger.warning("could not read the previous run's settings (a LoRA run will not resume): %s", e)
        else:
            self.previous_lora = before.lora if before is not None else None

    def settings(self, state: RunState, trainer_version: int = 0) -> RunSettings:
        c = self.config
        if c.lora and self.lora is None and state == RunState.RUNNING:
            # A LoRA run names its base by hash, known once the model is loaded: until then it says paused, or a
            # server on another base would play games for it before it could tell.
            state = RunState.PAUSED
        return RunSettings(
            run_id=self.run_id,
            state=state,
            num_generations=c.num_generations,
            groups_per_step=c.groups_per_step * self.ranks,
            max_staleness=c.max_staleness,
            max_pending_groups=c.pending_groups(self.ranks),
            sampling=Sampling(
                max_tokens=c.max_tokens,
                temperature=c.temperature,
                max_turns=c.max_turns,
                reply_prefix=c.reply_prefix,
                examples=c.schedule,
            ),
            max_game_tokens=c.max_game_tokens,
            vocab_size=self.vocab_size,
            exam=c.exam,
            lora=self.lora,
            trainer_version=trainer_version,
            updated_at=time.time(),
        )

    def know_vocabulary(self, size: int) -> None:
        """The loaded model's vocabulary size (its embedding rows): from now on in the run's settings, and
        checked on every group; the settings are written again if they were written before."""
        self.vocab_size = size
        if self.sent:
            self.send(self.state, self.version)

    def know_lora(self, lora: LoraSettings | None) -> None:
        """The run's LoRA settings (its base's hash is known once the model is loaded): from now on in the run's
        settings, written again if they were written before."""
        self.lora = lora
        if self.sent:
            self.send(self.state, self.version)

    def send(self, state: RunState, trainer_version: int) -> bool:
        """Tell the servers the run's state; False when the bucket refused the write (logged, and `unsent`
        stays True until `resend` or another `send` succeeds)."""
        self.state, self.version, self.sent = state, trainer_version, True
        try:
            self.bucket.write_run(self.settings(state, trainer_version))
        except (OSError, StorageError) as e:
            self.unsent = True
            self.last_error = f"{time.strftime('%H:%M:%S')} {e}"
            logger.warning("could not write the run's state (%s) to the bucket; retrying later: %s", state, e)
            return False
        self.unsent = False
        return True

    def resend(self) -> None:
        """Send the last state again if it was not written."""
        if self.unsent:
            self.send(self.state, self.version)


class FleetRollouts:
    """A `rollout_func(prompts, trainer) -> dict` for GRPOTrainer, fed by the groups in the bucket.

    Args:
        config: Group size and staleness bound.
        run: The run whose groups count; its state is sent again while a step waits, if the last write failed.
        current_version: The trainer's current weight version.
        stop: Set when the session stops: ends a wait for groups.
        ranks: Rank 0 takes every rank's groups and hands each rank its own. Default: one rank.
        tokenizer: Each group's tokens are decoded as TRL will before the group is taken (a group that fails is
            refused). None: not tried.

    Attributes (read from other threads):
        counts: Staleness totals (games taken, dropped, refused).
        refused: Groups refused, by reason (`wire.fleet.Refusal`).
        histogram: Staleness of every game taken, in versions -> games.
        recent: The latest games taken, newest last.
        waiting: True while a step waits for groups; `ready` groups of `needed` are there.
        last_step: What the last step took.
        last_error: The last failure to read the bucket, with its time; `failing`: failures in a row.
    """

    def __init__(
        self,
        config: TrainerConfig,
        run: FleetRun,
        current_version: Callable[[], int],
        stop: threading.Event | None = None,
        ranks: TrainerRanks | None = None,
        tokenizer: Any = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.refused: Counter[str] = Counter()
        self.ranks = ranks or TrainerRanks()
        self.run = run
        self.bucket = run.bucket
        self.run_id = run.run_id
        self.current_version = current_version
        self._stop = stop or threading.Event()
        self.moves = move_chooser(config)
        self.counts = StalenessCounts()
        self.histogram: Counter[int] = Counter()
        self.recent: deque[Trajectory] = deque(maxlen=20)
        self.waiting = False
        self.ready = 0
        self.needed = 0
        self.last_step = StepRollouts()
        self.last_error: str | None = None
        self.failing = 0
        self._queue: dict[str, GameGroup] = {}  # read, valid, not yet taken: at most the pending bound
        self._deferred: dict[str, tuple[int, float, str]] = {}  # read and valid, held back for room: their age
        self._done: set[str] = set()  # taken, dropped or refused: never read again
        self._undeleted: set[str] = set()  # done, but the delete failed: retried on the next look
        self._wait_s = self.bucket.budget.group_wait_s

    def take(self, n: int) -> list[GameGroup]:
        """The `n` oldest fresh groups, waiting while fewer are ready; stale ones are dropped and bad ones refused on
        the way.

        Raises:
            RolloutsStopped: the session stopped while waiting.
        """
        start = time.monotonic()
        step = StepRollouts()
        self.needed = n
        poll = FIRST_POLL_S
        taken: list[GameGroup] = []
        try:
            while True:
                self._look(step, n)
                refused: list[GameGroup] = []
                for group in sorted(self._queue.values(), key=_age):
                    if len(taken) == n:
                        break
                    del self._queue[group.path]
                    self._done.add(group.path)
                    (taken if self._admit(group, step) else refused).append(group)
                self._delete([g.path for g in refused])
                self.ready = len(self._queue) + len(taken)
                if len(taken) == n:
                    break
                self.waiting = True
                self.run.resend()
                if self._stop.wait(poll):
                    raise RolloutsStopped("stopped while waiting for rollout groups")
                poll = min(self._wait_s, 2 * poll)
        except RolloutsStopped:
            for group in taken:  # not trained on: back to the queue for the next step (a stop ends the run)
                self._done.discard(group.path)
                self._queue[group.path] = group
            raise
        finally:
            self.waiting = False
        now = self.current_version()
        for group in taken:
            step.groups.append(group.path)
            step.staleness[now - group.version] = step.staleness.get(now - group.version, 0) + len(group.games)
        self._delete([g.path for g in taken])
        self.ready = len(self._queue)
        step.waited_s = time.monotonic() - start
        games = [g for group in taken for g in group.games]
        step.examples_shown = examples_shown(games)
        step.straddled, step.versions_reported = straddled(games)
        schedule = self.config.schedule  # a game got the probability of the version that started it (`producer`)
        step.examples_scheduled = examples_scheduled(games, lambda g: schedule.probability(min(g.versions)))
        self.histogram.update(step.staleness)
        self.counts.add(games=len(games), seen=max(step.staleness, default=0))
        self.recent.extend(games)
        self.last_step = step
        return taken

    def _admit(self, group: GameGroup, step: StepRollouts) -> bool:
        """Try the group as the step will use it (its columns, its tokens decoded); refuse it on any error."""
        try:
            columns = trajectory_columns(group.games, [False] * len(group.games))
            if self.tokenizer is not None:
                self.tokenizer.batch_decode(columns["prompt_ids"] + columns["completion_ids"], skip_special_tokens=True)
        except Exception as e:  # whatever a group does, it must not end the run
            logger.exception("group %s failed on its way into the step; refused", group.path)
            self._count_refusal(group.path, f"{type(e).__name__}: {e}", Refusal.UNEXPECTED, step)
            return False
        return True

    def _look(self, step: StepRollouts, needed: int) -> None:
        """List the bucket's groups; read the new ones, holding at most the run's pending bound (or `needed`) in
        memory, the oldest; drop stale and refuse bad ones (deleting them)."""
        try:
            listed = self.bucket.list_groups(max_age=min(self.bucket.max_age, self._wait_s))
            if self._undeleted:
                self._delete(list(self._undeleted))
        except (OSError, StorageError) as e:
            self._failed(e)
            return
        now = self.current_version()
        settings = self.run.settings(self.run.state, now)
        room = max(settings.max_pending_groups, needed)
        discard: list[str] = []
        for path in self._deferred.keys() - {f.path for f in listed}:
            del self._deferred[path]
        try:
            for f in listed:
                if f.path in self._done or f.path in self._queue or f.path in self._deferred:
                    continue
                if group_run(f.path) != self.run_id:
                    self._refuse(f.path, "from another run", Refusal.ANOTHER_RUN, step, discard)
                elif (group := self._read(f.path, f, settings, now, step, discard)) is not None:
                    self._hold(group, room)
            while len(self._queue) < room and self._deferred:  # room again: the oldest held back, read again
                path = min(self._deferred, key=self._deferred.__getitem__)
                del self._deferred[path]
                if (group := self._read(path, None, settings, now, step, discard)) is not None:
                    self._queue[path] = group
        except (OSError, StorageError) as e:
            self._delete(discard)
            self._failed(e)
            return
        stale = [(p, k[0]) for p, k in self._deferred.items()] + [(p, g.version) for p, g in self._queue.items()]
        for path, version in stale:
            if now - version > self.config.max_staleness:
                logger.info(
                    "dropped group %s: %d versions behind, the bound is %d",
                    path,
                    now - version,
                    self.config.max_staleness,
                )
                self._queue.pop(path, None)
                self._deferred.pop(path, None)
                self._done.add(path)
                discard.append(path)
                step.dropped += self.config.num_generations
                self.counts.add(dropped=self.config.num_generations)
        self._delete(discard)
        self.failing = 0

    def _read(
        self,
        path: str,
        listed: StoredFile | None,
        settings: RunSettings,
        now: int,
        step: StepRollouts,
        discard: list[str],
    ) -> GameGroup | None:
        """The group at `path` checked against the run (refused unread when `listed` is larger than a group of the run
        can be), or None: refused, or deleted meanwhile. Raises OSError or StorageError when the bucket failed."""
        limit = max_group_bytes(settings)
        if listed is not None and listed.size > limit:
            self._refuse(
                path,
                f"{listed.size} bytes, more than a group of this run can be ({limit})",
                Refusal.TOO_LARGE,
                step,
                discard,
            )
            return None
        try:
            group = self.bucket.read_group(path, limit, listed)
            check_group(group, settings, now, path)
        except FileNotFoundError:
            return None  # deleted meanwhile (by a trainer of an earlier process)
        except FleetMessageError as e:
            self._refuse(path, e.reason, e.category, step, discard)
            return None
        except (OSError, StorageError):
            raise
        except Exception as e:  # a file must never end the run
            logger.exception("reading group %s failed unexpectedly; refused", path)
            self._refuse(path, f"{type(e).__name__}: {e}", Refusal.UNEXPECTED, step, discard)
            return None
        return group

    def _hold(self, group: GameGroup, room: int) -> None:
        """Queue `group`, keeping the `room` oldest groups in memory; a newer one is held back by its key alone
        (read again when there is room)."""
        if len(self._queue) < room:
            self._queue[group.path] = group
            return
        newest = max(self._queue.values(), key=_age)
        if _age(group) < _age(newest):
            del self._queue[newest.path]
            self._deferred[newest.path] = _age(newest)
            self._queue[group.path] = group
        else:
            self._deferred[group.path] = _age(group)

    def _refuse(self, path: str, reason: str, category: Refusal, step: StepRollouts, discard: list[str]) -> None:
        self._done.add(path)
        discard.append(path)
        self._count_refusal(path, reason, category, step)

    def _count_refusal(self, path: str, reason: str, category: Refusal, step: StepRollouts) -> None:
        logger.warning("refused rollout group %s (%s): %s", path, category, reason)
        step.refused += 1
        self.refused[str(category)] += 1
        self.counts.add(refused=1)

    def _delete(self, paths: list[str]) -> None:
        if not paths:
            return
        try:
            self.bucket.delete(paths)
            self._undeleted.difference_update(paths)
        except (OSError, StorageError) as e:
            self._undeleted.update(paths)
            logger.warning("could not delete %d rollout groups (retried later): %s", len(paths), e)

    def _failed(self, error: Exception) -> None:
        self.failing += 1
        self.last_error = f"{time.strftime('%H:%M:%S')} {error}"
        logger.warning("reading rollout groups failed (%d in a row): %s", self.failing, error)

    def __call__(self, prompts: list, trainer: Any = None) -> dict[str, list]:
        """TRL's `rollout_func` output for `len(prompts) / num_generations` groups: the prompts only say how many games
        the step needs; the servers pick the seeds, one per group."""
        n = len(prompts) // self.config.num_generations
        groups = self.take(n) if self.ranks.world == 1 else self._shared(n)
        games = [g for group in groups for g in group.games]
        return trajectory_columns(games, [False] * len(games), self.moves)

    def _shared(self, n: int) -> list[GameGroup]:
        """Several ranks, each asking for `n` groups: rank 0 takes all of them and each rank gets its own, in
        rank order (the order in which TRL gathers the ranks' games to compute advantages)."""
        taken: list[GameGroup] | None = None
        if self.ranks.main:
            try:
                taken = self.take(n * self.ranks.world)
            finally:  # None tells the other ranks that rank 0 stopped or failed while waiting
                self.ranks.broadcast(taken)
        else:
            taken = self.ranks.broadcast(None)
            if taken is None:
                raise RolloutsStopped("rank 0 stopped while waiting for rollout groups")
        return taken[self.ranks.rank * n : (self.ranks.rank + 1) * n]


def _age(group: GameGroup) -> tuple[int, float, str]:
    """What "oldest first" sorts groups by: the oldest weights that played them, then when they were written."""
    return group.version, group.created_at, group.path


class FleetMonitor:
    """Reads the rollout servers' heartbeats in a thread of its own, for `/status` and the UI: a server silent for the
    budget's `gone_after_s` shows as gone (`fleet.liveness`), and after `FORGET_AFTER_S` its heartbeat is deleted."""

    def __init__(self, bucket: FleetBucket) -> None:
        self.bucket = bucket
        self._watch = HeartbeatWatch(bucket, bucket.budget.gone_after_s)
        self._servers: list[FleetServer] = []
        self._reader = Periodic(self._poll, bucket.budget.monitor_s, "fleet-monitor")

    def start(self) -> FleetMonitor:
        self._reader.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop reading, waiting up to `timeout` seconds for a read in flight (the thread is a daemon)."""
        self._reader.close(timeout)

    def servers(self) -> list[FleetServer]:
        """The servers seen, by id (a consistent snapshot)."""
        return self._servers

    def refused(self) -> dict[str, int]:
        """Heartbeat files refused so far, by reason (`wire.fleet.Refusal`), each file once per reason."""
        return dict(self._watch.refused)

    def refresh(self) -> None:
        """Read the heartbeats once (the thread calls this every `interval`)."""
        seen = self._watch.read()
        forget = [s.path for s in seen if s.silent_s > FORGET_AFTER_S]
        if forget:
            self.bucket.delete(forget)
            self._watch.forget(forget)
        self._servers = sorted((self._server(s) for s in seen if s.path not in forget), key=lambda s: s.id)

    def _server(self, seen: SeenServer) -> FleetServer:
        beat = seen.heartbeat
        own = self.bucket.trust  # the trainer's own key, and the one it handed over from
        mine = {k.fingerprint for k in (own.key, *own.earlier) if k is not None}
        return FleetServer(
            id=beat.server_id,
            version=beat.version,
            games_per_min=round(beat.games_per_min, 2),
            last_seen_s=round(seen.silent_s, 1),
            state="gone" if seen.gone else str(beat.state),
            idle_share=round(beat.idle_share, 3),
            groups_written=beat.groups_written,
            run_id=beat.run_id,
            last_error=beat.last_error,
            authenticated=beat.authenticated,
            trusted_key=beat.trusted_key,
            trusts_trainer=beat.trusted_key in mine if beat.trusted_key is not None and mine else None,
        )

    def _poll(self) -> None:
        """`refresh` for the thread, its failures logged (and raised: the next read waits longer, `fleet.periodic`)."""
        try:
            self.refresh()
        except (OSError, StorageError) as e:
            logger.warning("reading the fleet's heartbeats failed: %s", e)
            raise
