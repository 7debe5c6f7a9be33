"""A training session: TRL's GRPOTrainer in a background thread, controlled by start / pause / stop.

The session takes its parts from the composition root (`main.build_session`) and does no I/O when made. What a run
trains and publishes with (`parts.load_parts`) is loaded in the training thread at the first `start`, so the server
and UI come up while a model loads; the parts are kept across runs (`start` after `stop` trains the same weights
on). Pausing waits at the end of an optimizer step. The history lives in the bucket (`fleet.history`): read before
the session is made, written again after each step.

Threads: the training thread loads the parts and runs `train()`; the publisher, the payload log and the history
keeper have their own; `status`, `history` and the controls are called from the HTTP and UI threads."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import delta
from dashboard.labels import public_location, public_text
from fleet.history import HistoryKeeper
from webguard import token_matches
from wire.errors import RolloutRefusedError
from wire.fleet import RunState
from wire.history import up_to
from wire.traffic import bucket_traffic
from wire.trainer import IMPORTANCE_METRIC, StepRecord, TrainerHistory, TrainerState, TrainerStatus
from wire.trajectory import Trajectory

from .config import TrainerConfig
from .exam import RECENT_EXAMS, ExamWatch
from .fleet import FleetMonitor, FleetRollouts, FleetRun
from .lora import LoraRefusedError
from .progress import StepCount
from .ranks import TrainerRanks
from .rollouts import RolloutSource, RolloutsStopped

if TYPE_CHECKING:  # parts.py imports torch and transformers: loaded by `load`, not on import
    from models.interrupt import Breaker

    from .parts import TrainerParts
    from .publishing import PayloadLog, VersionPublisher

logger = logging.getLogger(__name__)

#: Steps `status` carries in `recent` (the landing page's trend).
RECENT_STEPS = 20
#: Seconds a finished run waits for its last version to be committed before it shows as stopped.
RUN_END_FLUSH_S = 120.0
#: Wraps the publisher the publish callback calls after each step (a benchmark's schedule).
PublisherWrapper = Callable[[delta.Publisher], "VersionPublisher"]


class AccessDenied(PermissionError):
    """A control action without the owner's token (or with a wrong one)."""


class TrainingSession:
    """See the module docstring; `main.build_session` builds one.

    Args:
        config: Settings.
        bucket: The trainer's bucket (rank 0's a writer: its key signs the versions and the run's settings).
        ranks: The ranks under `torchrun`: rank 0 is controlled, writes the run's state, reads the heartbeats, and
            tells the others at each step's end whether to go on. Default: one rank.
        fleet: The fleet's run (None in request mode).
        client: Plays the games in request mode.
        monitor, exams, keeper: Rank 0's readers of the heartbeats and exam records, and its history keeper.
        history: What the trainer processes before this one recorded (`HistoryKeeper.load`).
        owner_token: The secret that start/pause/stop need. None: control is refused to everyone.
        wrap_publisher: Wraps the publisher the publish callback calls; None: the publisher itself.

    Attributes:
        parts: The loaded model, publisher and rollout function; None until loaded.
        state, error: What `status` reports.
        progress: Steps taken (earlier processes' included) and the steps each version holds.
        records: One `StepRecord` per step, oldest first (the earlier processes' too).
    """

    def __init__(
        self,
        config: TrainerConfig,
        bucket: delta.Bucket,
        *,
        ranks: TrainerRanks | None = None,
        fleet: FleetRun | None = None,
        client: RolloutSource | None = None,
        monitor: FleetMonitor | None = None,
        exams: ExamWatch | None = None,
        keeper: HistoryKeeper | None = None,
        history: TrainerHistory | None = None,
        owner_token: str | None = None,
        wrap_publisher: PublisherWrapper | None = None,
    ) -> None:
        self.config = config
        self.bucket = bucket
        self.ranks = ranks or TrainerRanks()
        self._fleet = fleet
        self.fleet_run = fleet if self.ranks.main else None  # rank 0's: what the servers are told
        self._client = client
        self.monitor = monitor
        self.exams = exams
        self.keeper = keeper
        self._owner_token = owner_token
        self._wrap_publisher = wrap_publisher
        self.parts: TrainerParts | None = None
        self.state: TrainerState = TrainerState.STOPPED
        self.error: str | None = None
        self._earlier = history or TrainerHistory(steps=[], payloads=[])
        self.records: deque[StepRecord] = deque(self._earlier.steps, maxlen=10_000)
        self.progress = StepCount(self.records[-1].step if self.records else 0)
        self._run_end = config.max_steps  # the step the current (or next) run ends at
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._held = False  # the training thread waits in `after_step` for a paused run to go on
        self._resume.set()
        self._stop = threading.Event()
        self._stop_asked: float | None = None  # when `stop_soon` was first called (`close` counts its wait from it)
        self._breaker: Breaker | None = None  # ends a step part way when the process must exit (`close`)
        self._thread: threading.Thread | None = None
        self._load_lock = threading.Lock()
        # When the last step ended (wall and CPU clock), and when the step before it did: `on_log` turns them
        # into the step's times (TRL calls it after `on_step_end`).
        self._last_step_end, self._last_step_cpu = time.perf_counter(), time.process_time()
        self._step_end, self._step_end_cpu = self._last_step_end, self._last_step_cpu

    # -- control ------------------------------------------------------------------------------------

    def authorize(self, token: str | None) -> None:
        """Raise AccessDenied unless `token` is the owner's (constant-time comparison)."""
        if not self._owner_token:
            raise AccessDenied("no owner token is set for this trainer (--owner-token / OWNER_TOKEN): control is off")
        if not token_matches(token, self._owner_token):
            raise AccessDenied("wrong or missing owner token")

    def control(self, action: str, token: str | None) -> TrainerState:
        """`start`, `pause` or `stop` for the owner; returns the new state.

        Raises:
            AccessDenied: the token is not the owner's.
            ValueError: an unknown action.
        """
        self.authorize(token)
        actions = {"start": self.start, "pause": self.pause, "stop": self.stop}
        if action not in actions:
            raise ValueError(f"unknown action {action!r}; choose one of {sorted(actions)}")
        actions[action]()
        return self.state

    def start(self) -> None:
        """Run (resume when paused); a no-op while running. Returns at once; training is in a thread."""
        with self._lock:
            alive = self._thread is not None and self._thread.is_alive()
            if self.state == TrainerState.PAUSED and alive:
                self.state = TrainerState.RUNNING
                self._announce(RunState.RUNNING)
                self._resume.set()
                return
            if alive:
                return
            if self.ranks.world > 1 and self._thread is not None:
                raise ValueError("the other ranks ended with the last run: start torchrun again to train again")
            self.state, self.error = TrainerState.RUNNING, None
            self._announce(RunState.RUNNING)
            self._stop.clear()
            self._stop_asked = None
            self._resume.set()
            self._thread = threading.Thread(target=self._train, name="trainer", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Hold training at the end of the current optimizer step (before any run: hold the start)."""
        with self._lock:
            if self.state == TrainerState.RUNNING or self._thread is None or not self._thread.is_alive():
                self._resume.clear()
                self.state = TrainerState.PAUSED
                self._announce(RunState.PAUSED)

    def stop_soon(self) -> None:
        """Tell the training thread to end the run (at the end of its step); no lock, no bucket write, returns at
        once: safe in a signal handler, where a server calls it as it begins to shut down (`close` follows)."""
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()
        self._stop.set()
        self._resume.set()

    def stop(self) -> None:
        """End the run at the end of the current step (a paused run ends at once)."""
        with self._lock:
            self.stop_soon()
            self._announce(RunState.STOPPED)
            if self._thread is None or not self._thread.is_alive():
                self.state = TrainerState.STOPPED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the training thread to end; True if it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def close(
        self,
        step_wait: float = 60.0,
        abandon_wait: float = 10.0,
        flush_timeout: float = 60.0,
        total: float | None = None,
    ) -> bool:
        """Stop, end the run, flush the last version to the bucket and stop the helper threads.

        Args:
            step_wait: Seconds, since the stop was asked, for the step in flight to end by itself; then it is ended part
                way (`models.interrupt.Breaker`, one rank only; its weights are not published).
            abandon_wait: Seconds to wait for the step to end part way.
            flush_timeout: Seconds to wait for the last finished version to be committed.
            total: Seconds the whole close may take (None: no bound beyond the waits'), shared in the order of what
                matters: the step, the flush, the history, then the readers.

        Returns:
            True if every thread of the session ended. False (logged): the process must end without Python's
            finalization (`os._exit`), which aborts a process whose thread is inside a torch operation.
        """
        self.stop()
        asked = self._stop_asked or time.monotonic()

        def within(seconds: float) -> float:
            left = seconds if total is None else min(seconds, asked + total - time.monotonic())
            return max(0.0, left)

        ended = self.wait(within(step_wait - (time.monotonic() - asked)))
        if not ended and self.ranks.world == 1:
            logger.info("the step in flight did not end within %.0f s: ending it part way", step_wait)
            if self._breaker is not None:
                self._breaker.trip()
            ended = self.wait(within(abandon_wait))
        parts = self.parts
        committed = True
        if parts is not None:
            if not ended:
                logger.warning("the step in flight is still running; flushing version %d", parts.callback.version)
            flush_s = within(flush_timeout)
            committed = parts.close(flush_s)
            if not committed:
                logger.warning("version %d was not committed within %.1f s", parts.callback.version, flush_s)
            if self.keeper is not None and self.keeper.problem is None and not self.keeper.close(within(5.0)):
                logger.warning("the history's last changes were not written to the bucket")
        # They only read the bucket (heartbeats, exams): nothing of theirs to save, so they get what is left.
        if self.monitor is not None:
            self.monitor.close(within(1.0))
        if self.exams is not None:
            self.exams.close(within(1.0))
        return ended and committed

    # -- what the UI and the API read ----------------------------------------------------------------

    @property
    def version(self) -> int:
        """The last version committed to the bucket (0 before any, and until loaded)."""
        parts = self.parts
        return parts.version if parts is not None else 0

    @property
    def steps(self) -> int:
        """Steps taken: this process's runs, and the processes before it on this bucket (from its history)."""
        return self.progress.steps

    def history(self) -> TrainerHistory:
        """Every step, payload and anchor, oldest first: what ``GET /history`` answers and the bucket keeps."""
        payloads = self.payloads
        return TrainerHistory(
            steps=list(self.records),
            payloads=list(payloads.records) if payloads is not None else list(self._earlier.payloads),
            anchors=list(payloads.anchors) if payloads is not None else list(self._earlier.anchors),
        )

    @property
    def payloads(self) -> PayloadLog | None:
        """What each committed delta cost (None until loaded, or with publishing off)."""
        parts = self.parts
        return parts.payloads if parts is not None else None

    def status(self) -> TrainerStatus:
        """What ``GET /status`` answers. `version` is the last version committed and `state_hash` its hash, and the step
        metrics those of its steps; `trainer_version` is the weights in memory (ahead while a publish is in flight);
        `resumed_from`/`resumed_hash` say what a resume loaded. Until the model is loaded, what comes from it is
        None."""
        parts = self.parts  # read once: the training thread sets it
        fleet = parts.rollouts if parts is not None and isinstance(parts.rollouts, FleetRollouts) else None
        version = parts.version if parts else 0
        step = self.progress.at(version) if parts else 0  # with the version: none before the model loads
        held = [r for r in self.records if r.step <= step]  # the steps `version` holds (not one still uploading)
        last = held[-1] if held else None
        return TrainerStatus(
            state=self.state,
            version=version,
            trainer_version=parts.callback.version if parts else None,
            state_hash=parts.state_hash if parts else None,
            resumed_from=parts.resumed_from if parts else None,
            resumed_hash=parts.resumed_hash if parts else None,
            step=step,
            max_steps=self.config.max_steps,
            last_step=self._run_end,
            mean_reward=last.reward if last else None,
            win_rate=last.win_rate if last else None,
            valid_rate=last.valid_rate if last else None,
            letters=last.letters if last else None,
            max_turns=self.config.max_turns,
            recent=held[-RECENT_STEPS:],
            step_s=last.step_s if last else None,
            max_staleness=self.config.max_staleness,
            staleness=parts.rollouts.counts.totals() if parts else None,
            bucket=public_location(self.config.bucket),  # /status is public: no folder of this machine on it
            mode="fleet" if self.config.fleet else "request",
            rollout_url=self.config.rollout_url,
            run_id=self.fleet_run.run_id if self.fleet_run is not None else None,
            groups_refused=dict(fleet.refused) if fleet is not None else {},
            heartbeats_refused=self.monitor.refused() if self.monitor is not None else {},
            exams_refused=self.exams.refused() if self.exams is not None else {},
            signed=self.fleet_run is not None and self.fleet_run.bucket.signed,
            waiting_for_rollouts=fleet.waiting if fleet is not None else False,
            held=self._held,
            groups_ready=fleet.ready if fleet is not None else 0,
            groups_needed=self.config.groups_per_step,
            fleet=self.monitor.servers() if self.monitor is not None else [],
            env_url=self.config.env_url,
            model=public_location(self.config.model),
            device=self.config.device,
            error=public_text(self.error, self.config.bucket, self.config.model),
            rollout_error=parts.rollouts.last_error if parts else None,
            rollout_failing=parts.rollouts.failing if parts else 0,
            bucket_traffic=bucket_traffic(self.bucket.traffic),
            examples=self.config.schedule,
            exam=self.config.exam,
            exams=self.exams.records()[-RECENT_EXAMS:] if self.exams is not None else [],
            lora=parts.lora if parts else None,
            trainable=parts.trainable if parts else None,
            parameters=parts.parameters if parts else None,
        )

    def recent_games(self, limit: int = 10) -> list[Trajectory]:
        """The latest games the trainer trained on, newest first."""
        parts = self.parts
        return list(parts.rollouts.recent)[::-1][:limit] if parts else []

    # -- the training thread -------------------------------------------------------------------------

    def load(self) -> TrainerParts:
        """Load the parts (`parts.load_parts`) in the calling thread and return them (at once if loaded before); `start`
        calls it from the training thread, so only a caller who wants the model, or its errors, before the first run
        needs it."""
        with self._load_lock:
            if self.parts is None:
                from .parts import load_parts

                parts = load_parts(
                    self.config,
                    self.bucket,
                    ranks=self.ranks,
                    fleet=self._fleet,
                    client=self._client,
                    stop=self._stop,
                    history=self._earlier,
                    wrap_publisher=self._wrap_publisher,
                )
                self._keep_history_up_to(parts.resumed_from or 0)
                self.parts = parts
                if self.keeper is not None:
                    self.keeper.start(self.history)
                    if self.parts.payloads is not None:
                        self.parts.payloads.on_record = self.keeper.changed
            return self.parts

    def _keep_history_up_to(self, version: int) -> None:
        """Drop the history's records of versions after `version`, the one the model resumes from: a trainer
        killed between a step's record and its version's commit left them, and their weights are gone."""
        kept = up_to(self.history(), version)
        dropped = len(self.records) - len(kept.steps)
        if dropped:
            logger.warning(
                "history: %d step(s) of versions after %d, the bucket's newest, dropped (never committed)",
                dropped,
                version,
            )
        self.records = deque(kept.steps, maxlen=self.records.maxlen)
        self._earlier = kept
        self.progress = StepCount(self.records[-1].step if self.records else 0)

    def _trainer(self, parts: TrainerParts) -> Any:
        """A GRPOTrainer for one run of `max_steps` steps on the loaded model."""
        from .callbacks import SessionCallback
        from .offpolicy import OffPolicyGRPOTrainer
        from .task import REWARD_FUNCS, REWARD_WEIGHTS, seed_dataset

        c = self.config
        args = c.grpo_config(list(REWARD_WEIGHTS))
        rows = max(c.max_steps * c.groups_per_step, 1)
        dataset = seed_dataset(rows, seed=c.seed + parts.callback.version)
        # A LoRA run: TRL wraps the model with PEFT in the first run's trainer; later runs train that PEFT model.
        peft = None
        if parts.lora is not None:
            from .lora import wrapped

            peft = None if wrapped(parts.model) else parts.lora.peft_config()
        trainer = OffPolicyGRPOTrainer(
            model=parts.model,
            reward_funcs=list(REWARD_FUNCS),
            args=args,
            train_dataset=dataset,
            processing_class=parts.tokenizer,
            rollout_func=parts.rollouts,
            callbacks=[parts.callback, SessionCallback(self)],
            importance_cap=c.importance_cap,
            current_version=lambda: parts.callback.version,
            max_staleness=c.max_staleness,
            peft_config=peft,
        )
        if parts.lora is not None:
            parts.model = trainer.model  # type: ignore[assignment]  # the PEFT model TRL made: it trains in its place
        return trainer

    def _train(self) -> None:
        from models.interrupt import Breaker, Interrupted

        try:
            parts = self.load()
            self._resume.wait()  # paused while the model loaded: hold before the first step
            if self.ranks.broadcast(self._stop.is_set()):  # stopped meanwhile: no run (rank 0 decides)
                return
            trainer = self._trainer(parts)
            self._run_end = self.progress.steps + self.config.max_steps
            self._last_step_end, self._last_step_cpu = time.perf_counter(), time.process_time()
            if self.ranks.world == 1:  # several ranks end a step together or not at all
                self._breaker = Breaker()
                self._breaker.attach(trainer.model)
            try:
                trainer.train()
            finally:
                if self._breaker is not None:
                    self._breaker.detach()
            # The run's last step is committed before the run shows as stopped (every rank at once: with several,
            # a step's snapshot waits until the ranks agree it goes, and after the last step nothing else comes).
            if parts.publisher is not None and not parts.publisher.flush(RUN_END_FLUSH_S):
                logger.warning(
                    "the run's last version was not committed within %.0f s; it goes on uploading", RUN_END_FLUSH_S
                )
        except RolloutsStopped:
            logger.info("stopped while waiting for the rollout")
        except Interrupted:
            logger.info("stopped part way through step %d: its weights are not published", self.progress.steps + 1)
        except Exception as e:  # reported through status(); the thread ends
            if isinstance(e, (RolloutRefusedError, LoraRefusedError)):  # a setting to fix, not a bug: no traceback
                logger.error("training stopped: %s", e)
            else:
                logger.exception("training stopped on an error")
            self.error = f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self.state = TrainerState.STOPPED
                self._announce(RunState.STOPPED)
                self._resume.set()

    def _announce(self, state: RunState) -> None:
        """Tell the fleet the run's state (fleet mode); a failed write is logged and sent again at the next
        step end or while a step waits for groups."""
        if self.fleet_run is not None:
            version = self.parts.callback.version if self.parts is not None else 0
            self.fleet_run.send(state, version)

    # -- hooks (`callbacks.SessionCallback` calls them from TRL's loop, in this order) -------------------

    def on_step_end(self) -> None:
        """At the end of each step: count it, with the version its weights were handed to the publisher as."""
        self._step_end = time.perf_counter()
        self._step_end_cpu = time.process_time()
        if self.parts is not None:  # the publish callback ran first: the version this step's weights go out as
            self.progress.step_done(self.parts.callback.version)
        if self.fleet_run is not None:  # the run's state, if its last write to the bucket failed
            self.fleet_run.resend()

    def after_step(self, control: Any) -> None:
        """After each step's end and its record: honour pause (wait here) and stop."""
        if not self._resume.is_set():
            self._held = True
            try:
                self._resume.wait()
            finally:
                self._held = False
        if self.ranks.broadcast(self._stop.is_set()):  # rank 0's decision; the others wait here while it pauses
            control.should_training_stop = True

    def on_log(self, logs: dict[str, float]) -> None:
        """Each step's TRL log (the one holding "reward") becomes a `StepRecord`."""
        if "reward" not in logs:
            return
        parts = self.parts
        assert parts is not None, "a run's hooks are called after `load`"
        now = time.perf_counter()
        end = self._step_end
        took = parts.rollouts.last_step
        self.records.append(
            StepRecord(
                step=self.progress.steps,
                version=parts.callback.version,
                reward=_number(logs.get("rewards/game_reward/mean", logs["reward"])),
                win_rate=_number(logs.get("rewards/won/mean")),
                valid_rate=_number(logs.get("rewards/valid_guesses/mean")),
                letters=_number(logs.get("rewards/letters/mean")),
                step_s=end - self._last_step_end,
                cpu_s=self._step_end_cpu - self._last_step_cpu,
                publish_s=parts.callback.copy_s,
                wait_s=took.waited_s,
                groups=took.groups,
                staleness=took.staleness,
                dropped=took.dropped,
                examples_shown=took.examples_shown,
                straddled=took.straddled,
                versions_reported=took.versions_reported,
                examples_scheduled=took.examples_scheduled,
                ratio_mean=_number(logs.get(f"{IMPORTANCE_METRIC}/mean")),
                ratio_min=_number(logs.get(f"{IMPORTANCE_METRIC}/min")),
                ratio_max=_number(logs.get(f"{IMPORTANCE_METRIC}/max")),
                at=time.time(),
            )
        )
        self._last_step_end, self._last_step_cpu = now, time.process_time()
        if self.keeper is not None:
            self.keeper.changed()


def _number(value: float | None) -> float | None:
    """A logged mean as a JSON-safe number: TRL logs NaN when every game of the step was dropped."""
    return None if value is None or math.isnan(value) else float(value)
