"""The trainer's side of the fleet: rollout servers coordinated only through the bucket (`wire.fleet`).

`FleetRun` writes the run's settings (``fleet/run.json``) at every change of the session's state;
the rollout servers read them and produce groups of games continuously, as long as the run runs and
fewer than `max_pending_groups` of its groups wait in the bucket (back-pressure). `FleetRollouts` is
GRPOTrainer's `rollout_func`: each step it takes the step's complete groups from whichever servers
wrote them, oldest first, and waits only while fewer are ready. A group is judged on the oldest weight
version that played any of its replies: more than `max_staleness` versions behind the trainer's, it is
dropped and counted; the rest is corrected for being off-policy (`offpolicy.OffPolicyGRPOTrainer`).
Files from another run, and files that are torn, corrupt or crafted, are refused and counted, never
trained on. Whatever the trainer took, dropped or refused, it deletes; it remembers what it took, so a
group whose deletion failed is never used twice. `FleetMonitor` reads the servers' heartbeats.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from delta import StorageError
from wire.fleet import FleetMessageError, GameGroup, RunSettings, RunState, Sampling, group_run
from wire.fleet_bucket import FleetBucket
from wire.liveness import HeartbeatWatch, SeenServer
from wire.trainer import FleetServer
from wire.trajectory import Trajectory

from .config import TrainerConfig
from .credit import move_chooser
from .ranks import TrainerRanks
from .rollouts import RolloutsStopped, trajectory_columns
from .staleness import StalenessCounts, StepRollouts

logger = logging.getLogger(__name__)

#: Seconds between two looks at the bucket while a step waits for groups: the first look again after
#: `FIRST_POLL_S`, then twice as long each time, up to `POLL_S`. An idle trainer costs more than a listing, and
#: most waits end soon after they start (a server writes its batch as the step needs it), so the first looks are
#: quick; a long wait (no server) costs a listing every `POLL_S`.
FIRST_POLL_S = 0.02
POLL_S = 0.5
#: Seconds after which a gone server's heartbeat file is deleted.
FORGET_AFTER_S = 3600.0


def new_run_id() -> str:
    """A fresh run id: the time it started and a random part, so runs sort by start."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


class FleetRun:
    """Writes ``fleet/run.json`` for one trainer process; a new process is a new run.

    Args:
        config: The trainer's settings (group size, groups per step, staleness, sampling).
        bucket: The fleet's bucket.
        run_id: The run's id (default: a new one).
        ranks: The trainer's ranks: a step takes `groups_per_step` groups for each.
    """

    def __init__(self, config: TrainerConfig, bucket: FleetBucket, run_id: str | None = None, ranks: int = 1) -> None:
        self.config = config
        self.ranks = ranks
        self.bucket = bucket
        self.run_id = run_id or new_run_id()
        self.state = RunState.STOPPED
        self.version = 0
        self.unsent = False
        self.last_error: str | None = None

    def settings(self, state: RunState, trainer_version: int = 0) -> RunSettings:
        c = self.config
        return RunSettings(
            run_id=self.run_id, state=state, num_generations=c.num_generations,
            groups_per_step=c.groups_per_step * self.ranks, max_staleness=c.max_staleness,
            max_pending_groups=c.pending_groups(self.ranks),
            sampling=Sampling(max_tokens=c.max_tokens, temperature=c.temperature, max_turns=c.max_turns,
                              reply_prefix=c.reply_prefix, examples=c.examples),
            exam=c.exam, trainer_version=trainer_version, updated_at=time.time())

    def send(self, state: RunState, trainer_version: int) -> bool:
        """Tell the servers the run's state; False when the bucket refused the write (logged, and `unsent`
        stays True until `resend` or another `send` succeeds)."""
        self.state, self.version = state, trainer_version
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
        run: The run whose groups count (any other run's are refused); its state is sent again while a
            step waits, if the last write failed.
        current_version: The trainer's current weight version.
        stop: Set when the session stops: ends a wait for groups.
        ranks: The trainer's ranks (`torchrun`): rank 0 takes every rank's groups from the bucket and hands each
            rank its own; the other ranks never read the bucket. Default: one rank.

    Attributes (read by the session and the UI from other threads):
        counts: Staleness totals (games taken, dropped, refused).
        histogram: Staleness of every game taken, in versions -> games.
        recent: The latest games taken, newest last.
        waiting: True while a step waits for groups; `ready` groups of `needed` are there.
        last_step: What the last step took.
        last_error: The last failure to read the bucket, with its time; `failing`: failures in a row.
    """

    def __init__(self, config: TrainerConfig, run: FleetRun, current_version: Callable[[], int],
                 stop: threading.Event | None = None, ranks: TrainerRanks | None = None) -> None:
        self.config = config
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
        self._queue: dict[str, GameGroup] = {}  # read, valid, not yet taken
        self._done: set[str] = set()  # taken, dropped or refused: never read again
        self._undeleted: set[str] = set()  # done, but the delete failed: retried on the next look

    def take(self, n: int) -> list[GameGroup]:
        """The `n` oldest fresh groups, waiting while fewer are ready; drops stale ones on the way.

        Raises:
            RolloutsStopped: the session stopped while waiting.
        """
        start = time.monotonic()
        step = StepRollouts()
        self.needed = n
        poll = FIRST_POLL_S
        try:
            while True:
                self._look(step)
                self.ready = len(self._queue)
                if self.ready >= n:
                    break
                self.waiting = True
                self.run.resend()
                if self._stop.wait(poll):
                    raise RolloutsStopped("stopped while waiting for rollout groups")
                poll = min(POLL_S, 2 * poll)
        finally:
            self.waiting = False
        oldest = sorted(self._queue.values(), key=lambda g: (g.version, g.created_at, g.path))[:n]
        now = self.current_version()
        for group in oldest:
            del self._queue[group.path]
            self._done.add(group.path)
            step.groups.append(group.path)
            step.staleness[now - group.version] = step.staleness.get(now - group.version, 0) + len(group.games)
        self._delete([g.path for g in oldest])
        self.ready = len(self._queue)
        step.waited_s = time.monotonic() - start
        games = [g for group in oldest for g in group.games]
        self.histogram.update(step.staleness)
        self.counts.add(games=len(games), seen=max(step.staleness, default=0))
        self.recent.extend(games)
        self.last_step = step
        return oldest

    def _look(self, step: StepRollouts) -> None:
        """List the bucket's groups; read the new ones; drop stale and refuse bad ones (deleting them)."""
        try:
            listed = self.bucket.list_groups()
            if self._undeleted:
                self._delete(list(self._undeleted))
        except (OSError, StorageError) as e:
            self._failed(e)
            return
        now = self.current_version()
        discard: list[str] = []
        for f in listed:
            if f.path in self._done or f.path in self._queue:
                continue
            if group_run(f.path) != self.run_id:
                self._refuse(f.path, "from another run", step, discard)
                continue
            try:
                group = self.bucket.read_group(f.path)
            except FileNotFoundError:
                continue  # deleted meanwhile (by a trainer of an earlier process)
            except FleetMessageError as e:
                self._refuse(f.path, e.reason, step, discard)
                continue
            except (OSError, StorageError) as e:
                self._failed(e)
                return
            if group.run_id != self.run_id or len(group.games) != self.config.num_generations:
                why = "from another run" if group.run_id != self.run_id else \
                    f"{len(group.games)} games, the run's groups hold {self.config.num_generations}"
                self._refuse(f.path, why, step, discard)
                continue
            self._queue[f.path] = group
        for path, group in list(self._queue.items()):
            if now - group.version > self.config.max_staleness:
                logger.info("dropped group %s: %d versions behind, the bound is %d", path, now - group.version,
                            self.config.max_staleness)
                del self._queue[path]
                self._done.add(path)
                discard.append(path)
                step.dropped += len(group.games)
                self.counts.add(dropped=len(group.games))
        self._delete(discard)
        self.failing = 0

    def _refuse(self, path: str, reason: str, step: StepRollouts, discard: list[str]) -> None:
        logger.warning("refused rollout group %s: %s", path, reason)
        self._done.add(path)
        discard.append(path)
        step.refused += 1
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
        """TRL's `rollout_func` output for `len(prompts) / num_generations` groups.

        The dataset's prompts only say how many games the step needs: the rollout servers pick the
        seeds, one per group, and GRPO compares the games of each group as it would games of one prompt.
        """
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
        return taken[self.ranks.rank * n:(self.ranks.rank + 1) * n]


class FleetMonitor:
    """Reads the rollout servers' heartbeats in a thread of its own, for `/status` and the UI.

    A server is alive while its heartbeat's `beat` keeps changing (`wire.liveness`); silent for
    `GONE_AFTER_S`, it shows as gone, and after `FORGET_AFTER_S` its heartbeat file is deleted.

    Args:
        bucket: The fleet's bucket.
        interval: Seconds between two reads.
    """

    def __init__(self, bucket: FleetBucket, interval: float = 2.0) -> None:
        self.bucket = bucket
        self.interval = interval
        self._watch = HeartbeatWatch(bucket)
        self._servers: list[FleetServer] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> FleetMonitor:
        self._thread = threading.Thread(target=self._run, name="fleet-monitor", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def servers(self) -> list[FleetServer]:
        """The servers seen, by id (a consistent snapshot)."""
        return self._servers

    def refresh(self) -> None:
        """Read the heartbeats once (the thread calls this every `interval`)."""
        seen = self._watch.read()
        forget = [s.path for s in seen if s.silent_s > FORGET_AFTER_S]
        if forget:
            self.bucket.delete(forget)
            self._watch.forget(forget)
        self._servers = sorted((self._server(s) for s in seen if s.path not in forget), key=lambda s: s.id)

    @staticmethod
    def _server(seen: SeenServer) -> FleetServer:
        beat = seen.heartbeat
        return FleetServer(id=beat.server_id, version=beat.version, games_per_min=round(beat.games_per_min, 2),
                           last_seen_s=round(seen.silent_s, 1), state="gone" if seen.gone else str(beat.state),
                           idle_share=round(beat.idle_share, 3), groups_written=beat.groups_written,
                           run_id=beat.run_id, last_error=beat.last_error)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except (OSError, StorageError) as e:
                logger.warning("reading the fleet's heartbeats failed: %s", e)
            self._stop.wait(self.interval)

