"""A training session: TRL's GRPOTrainer in a background thread, controlled by start / pause / stop.

The session owns the model, the publisher and the rollout function across runs: `start` after a
`stop` begins a new `GRPOTrainer.train()` on the same weights (the optimizer's moments start afresh,
as on a restart; the bucket holds weights, not optimizer state). Pausing waits at the end of an
optimizer step, after its version was handed to the publisher.

Threads: the training thread runs `train()`; the publisher and the payload log have their own;
`status`, `history` and the control methods are called from the HTTP and UI threads.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

from rollout_space.messages import Trajectory
from webguard import token_matches

from .config import TrainerConfig
from .messages import StepRecord, TrainerState, TrainerStatus
from .rollouts import RolloutsStopped

logger = logging.getLogger(__name__)


class AccessDenied(PermissionError):
    """A control action without the owner's token (or with a wrong one)."""


class TrainingSession:
    """See the module docstring.

    Args:
        config: Settings.
        owner_token: The secret that start/pause/stop need. None: control is refused to everyone
            (the session then only runs what it was launched to run).
        client: The rollout client (default: `rollout_space.client.RolloutClient(config.rollout_url)`).
    """

    def __init__(self, config: TrainerConfig, owner_token: str | None = None, client: Any = None) -> None:
        self.config = config
        self._owner_token = owner_token
        self._client = client
        self.state: TrainerState = TrainerState.STOPPED
        self.error: str | None = None
        self.steps = 0
        self.records: deque[StepRecord] = deque(maxlen=10_000)
        self._lock = threading.Lock()
        self._resume = threading.Event()
        self._resume.set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._built = False
        self.publisher: Any = None  # delta.Publisher, once built (None: publishing off)
        self.payloads: Any = None  # publishing.PayloadLog, likewise
        self.resumed_from: int | None = None
        self.resumed_hash: str | None = None
        self._last_step_end, self._last_step_cpu = time.perf_counter(), time.process_time()

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
                self._resume.set()
                return
            if alive:
                return
            self.state, self.error = TrainerState.RUNNING, None
            self._stop.clear()
            self._resume.set()
            self._thread = threading.Thread(target=self._train, name="trainer", daemon=True)
            self._thread.start()

    def pause(self) -> None:
        """Hold training at the end of the current optimizer step (before any run: hold the start)."""
        with self._lock:
            if self.state == TrainerState.RUNNING or self._thread is None or not self._thread.is_alive():
                self._resume.clear()
                self.state = TrainerState.PAUSED

    def stop(self) -> None:
        """End the run at the end of the current step (a paused run ends at once)."""
        with self._lock:
            self._stop.set()
            self._resume.set()
            if self._thread is None or not self._thread.is_alive():
                self.state = TrainerState.STOPPED

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the training thread to end; True if it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def close(self, timeout: float = 60.0) -> None:
        """Stop, wait for the run, flush the last version to the bucket and stop the helper threads."""
        self.stop()
        self.wait(timeout)
        if self._built:
            if self.publisher is not None:
                self.publisher.close(timeout)
            if self.payloads is not None:
                self.payloads.close()

    # -- what the UI and the API read ----------------------------------------------------------------

    @property
    def version(self) -> int:
        """The last version committed to the bucket (0 before any)."""
        if not self._built:
            return 0
        if self.publisher is None:  # publishing off: the version the trainer's weights are at
            return self.callback.version
        return self.publisher.last.version if self.publisher.last is not None else 0

    def status(self) -> TrainerStatus:
        """What ``GET /status`` answers: state, versions, step, latest reward and win rate, staleness counts.

        `version` is the last version committed to the bucket and `state_hash` its hash; `trainer_version`
        the version of the weights in memory (ahead while a publish is in flight). After a resume,
        `resumed_from` is the bucket version loaded and `resumed_hash` the hash of the weights after loading.
        `device` is where the weights train (`cpu`, `cuda`).
        """
        last = self.records[-1] if self.records else None
        return TrainerStatus(
            state=self.state,
            version=self.version,
            trainer_version=self.callback.version if self._built else None,
            state_hash=self.publisher.last.state_hash if self._built and self.publisher and self.publisher.last
            else None,
            resumed_from=self.resumed_from,
            resumed_hash=self.resumed_hash,
            step=self.steps,
            max_steps=self.config.max_steps,
            mean_reward=last.reward if last else None,
            win_rate=last.win_rate if last else None,
            valid_rate=last.valid_rate if last else None,
            step_s=last.step_s if last else None,
            max_staleness=self.config.max_staleness,
            staleness=self.rollouts.counts.totals() if self._built else None,
            bucket=self.config.bucket,
            rollout_url=self.config.rollout_url,
            env_url=self.config.env_url,
            model=self.config.model,
            device=self.config.device,
            error=self.error,
            rollout_error=self.rollouts.last_error if self._built else None,
            rollout_failing=self.rollouts.failing if self._built else 0,
        )

    def recent_games(self, limit: int = 10) -> list[Trajectory]:
        """The latest games the trainer trained on, newest first."""
        return list(self.rollouts.recent)[::-1][:limit] if self._built else []

    # -- the training thread -------------------------------------------------------------------------

    def _build(self) -> None:
        """Load the model (and the bucket's latest state into it), the publisher and the rollout function."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        import delta
        from dashboard.payload import dense_bytes

        from .publishing import PayloadLog, PublishCallback
        from .rollouts import WordleRollouts
        from .weights import cast_into, master_tensors, published_state, resume

        c = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(c.model, local_files_only=True)
        # fp32 master weights, whatever the checkpoint's dtype; the published state is their cast to it.
        self.model = AutoModelForCausalLM.from_pretrained(c.model, dtype=torch.float32, local_files_only=True)
        self.model.to(c.device)
        self.master = master_tensors(self.model, c.model)
        self.published = published_state(self.master, c.model)
        version = resume(self.published, c.bucket)
        if version:  # the proof that the weights are the bucket's, bit for bit (see `status`)
            cast_into(self.master, self.published)
            self.resumed_from, self.resumed_hash = version, delta.state_digest(self.published).hexdigest
        self.publisher = None
        self.payloads = None
        if c.publish:
            pconfig = delta.PublisherConfig(anchor_every=c.anchor_every, codec=c.codec or delta.DEFAULT_CODEC)
            self.publisher = delta.Publisher(c.bucket, pconfig, base_state=self.published if version else None)
            self.payloads = PayloadLog(c.bucket, dense_bytes(self.published)).start()
        self.callback = PublishCallback(self.publisher, self.published, version, master=self.master)
        if self._client is None:
            from rollout_space.client import RolloutClient

            self._client = RolloutClient(c.rollout_url, token=c.rollout_token)
        self.rollouts = WordleRollouts(c, self._client, lambda: self.callback.version, self._stop)
        self._built = True

    def _trainer(self) -> Any:
        """A GRPOTrainer for one run of `max_steps` steps on the session's model."""
        from trl import GRPOConfig, GRPOTrainer

        from .callbacks import SessionCallback
        from .task import REWARD_FUNCS, REWARD_WEIGHTS, seed_dataset

        c = self.config
        args = GRPOConfig(
            output_dir=c.output_dir, max_steps=c.max_steps, learning_rate=c.learning_rate,
            per_device_train_batch_size=c.games_per_step, gradient_accumulation_steps=1,
            num_generations=c.num_generations, max_completion_length=c.max_tokens * c.max_turns * 4,
            temperature=c.temperature, reward_weights=list(REWARD_WEIGHTS), beta=0.0,
            use_cpu=c.device == "cpu", bf16=c.device != "cpu", logging_steps=1, save_strategy="no", report_to="none",
            disable_tqdm=True, seed=c.seed, data_seed=c.seed, dataloader_num_workers=0,
        )
        rows = max(c.max_steps * c.groups_per_step, 1)
        dataset = seed_dataset(rows, seed=c.seed + self.callback.version)
        return GRPOTrainer(model=self.model, reward_funcs=list(REWARD_FUNCS), args=args, train_dataset=dataset,
                           processing_class=self.tokenizer, rollout_func=self.rollouts,
                           callbacks=[self.callback, SessionCallback(self)])

    def _train(self) -> None:
        try:
            if not self._built:
                self._build()
            trainer = self._trainer()
            self._last_step_end, self._last_step_cpu = time.perf_counter(), time.process_time()
            trainer.train()
        except RolloutsStopped:
            logger.info("stopped while waiting for the rollout")
        except Exception as e:  # reported through status(); the thread ends
            logger.exception("training stopped on an error")
            self.error = f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self.state = TrainerState.STOPPED
                self._resume.set()

    # -- hooks (`callbacks.SessionCallback` calls them from TRL's loop) -------------------------------

    def on_step_end(self, control: Any) -> None:
        """At the end of each step: honour pause (wait here) and stop."""
        self._step_end = time.perf_counter()
        self._step_end_cpu = time.process_time()
        if not self._resume.is_set():
            self._resume.wait()
        if self._stop.is_set():
            control.should_training_stop = True

    def on_log(self, logs: dict[str, float]) -> None:
        """Each step's TRL log (the one holding "reward") becomes a `StepRecord`."""
        if "reward" not in logs:
            return
        now = time.perf_counter()
        end = getattr(self, "_step_end", now)
        self.steps += 1
        self.records.append(StepRecord(
            step=self.steps, version=self.callback.version,
            reward=_number(logs.get("rewards/env_reward/mean", logs["reward"])),
            win_rate=_number(logs.get("rewards/won/mean")),
            valid_rate=_number(logs.get("rewards/valid_guesses/mean")),
            step_s=end - self._last_step_end, cpu_s=getattr(self, "_step_end_cpu", 0.0) - self._last_step_cpu,
            publish_s=self.callback.copy_s, at=time.time()))
        self._last_step_end, self._last_step_cpu = now, time.process_time()


def _number(value: float | None) -> float | None:
    """A logged mean as a JSON-safe number: TRL logs NaN when every game of the step was dropped."""
    return None if value is None or math.isnan(value) else float(value)
