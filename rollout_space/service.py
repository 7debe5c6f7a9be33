"""The rollout Space's core, behind both its HTTP API and its UI: one engine kept current by a follower,
generation for the trainer within caps, and Wordle games against the env Space."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dashboard.labels import public_location, public_text
from delta import DeltaHeader
from fleet.bucket import FleetBucket
from fleet.exams import ExamShelf
from wire.env import GameKind
from wire.errors import RolloutError
from wire.rollout import RolloutStatus, Trajectory
from wire.traffic import bucket_traffic

from .engines import Completion, Engine, SamplingParams
from .engines.base import Prompt
from .env_client import EnvClient
from .errors import LimitExceededError
from .exam import Examiner
from .follower import Follower, SyncRecord
from .games import GameSpec, PlayParams, play_games
from .priority import BehindTrainer, TrainerFirst
from .producer import GroupProducer
from .run_watch import RunWatch

logger = logging.getLogger(__name__)

#: The latest games kept for the UI's feed.
RECENT_GAMES = 100


@dataclass(frozen=True)
class ServiceLimits:
    """Caps on one request, so one caller cannot hold the engine for minutes: prompts per `/generate`, tokens per
    completion, games per `/rollout`; and `showcase_every`: seconds without any game after which the Space plays one
    on its own (0: never)."""

    max_batch: int = 256
    max_tokens: int = 1024
    max_games: int = 256
    showcase_every: float = 0.0

    def __post_init__(self) -> None:
        if min(self.max_batch, self.max_tokens, self.max_games) < 1:
            raise ValueError("max_batch, max_tokens and max_games must be at least 1")
        if self.showcase_every < 0:
            raise ValueError(f"showcase_every must be >= 0 seconds, got {self.showcase_every}")


class RolloutService:
    """Serves the engine's current version and follows the bucket.

    Args:
        engine: The engine (owned: `close` closes it).
        follower: Keeps the engine current; None serves the model as loaded.
        producer: Plays game groups for the fleet (`attach_producer`); None: only requests.
        env: The env Space's client; None refuses games.
        limits: Request caps.
        model, engine_kind: What to call the model and the engine in `status()`.
    """

    def __init__(
        self,
        engine: Engine,
        follower: Follower | None,
        env: EnvClient | None,
        limits: ServiceLimits | None = None,
        *,
        model: str = "",
        engine_kind: str = "",
    ) -> None:
        self.engine = engine
        self.follower = follower
        self.env = env
        self.limits = limits or ServiceLimits()
        self.model = model
        self.engine_kind = engine_kind or type(engine).__name__
        self._games: deque[Trajectory] = deque(maxlen=RECENT_GAMES)  # the latest, for the UI
        self._kinds: dict[str, GameKind] = {}  # why each of them was played (at most twice as many ids)
        self._played = 0  # every game, for /status
        self._tokens = 0
        self._straddled = 0  # replies whose tokens more than one weight version sampled
        self._versions_reported: bool | None = None  # whether the engine reports each token's version (None: no game)
        self._busy_s = 0.0  # seconds inside play(), any caller
        self._last_game = time.monotonic()
        self._stats_lock = threading.Lock()
        self._stop = threading.Event()
        self._showcase: threading.Thread | None = None
        self._gate = TrainerFirst()
        self.producer: GroupProducer | None = None
        self.run_watch: RunWatch | None = None
        self.examiner: Examiner | None = None

    # -- lifecycle -----------------------------------------------------------------------------------

    def attach_producer(
        self,
        bucket: FleetBucket,
        server_id: str,
        poll_s: float | None = None,
        first_step_alone: bool = False,
        **budget: Any,
    ) -> GroupProducer:
        """Play game groups for the fleet in `bucket` once started (see `producer.GroupProducer`, and there
        `first_step_alone`; `poll_s` and `budget`'s intervals: None, the bucket's), with the trainer's priority over
        public games, and the exams the run asks for (`exam.Examiner`, with an env); returns the producer."""

        def play(specs: Sequence[GameSpec], params: PlayParams) -> list[Trajectory]:
            return self.play(specs, params)

        def version() -> int:
            return self.engine.version

        def published() -> int | None:
            return self.follower.latest if self.follower is not None else None

        if self.env is not None:
            shelf = ExamShelf(bucket.bucket, bucket.key)
            self.examiner = Examiner(
                play,
                version,
                self._served_hash,
                self.env,
                shelf,
                server_id,
                hold=self.follower.holding if self.follower is not None else contextlib.nullcontext,
            )
        self.producer = GroupProducer(
            play,
            version,
            bucket,
            server_id,
            poll_s=poll_s,
            catch_up=self.follower.sync if self.follower is not None else None,
            examiner=self.examiner,
            max_games=self.limits.max_games,
            max_tokens=self.limits.max_tokens,
            adopt=self.follower.adopt if self.follower is not None else None,
            published=published,
            first_step_alone=first_step_alone,
            **budget,
        )
        return self.producer

    def watch_run(self, bucket: FleetBucket, poll_s: float | None = None) -> RunWatch:
        """Without a producer (`--no-produce`): follow the state the run's settings name (a LoRA run's adapter, or
        full weights) from a thread of its own once started (`run_watch.RunWatch`); returns it."""
        if self.follower is None:
            raise ValueError("a server that follows no bucket has no run to watch")
        self.run_watch = RunWatch(bucket, self.follower.adopt, poll_s or bucket.budget.poll_s)
        return self.run_watch

    def start(self) -> None:
        """Start following the bucket, producing games for the fleet and, if configured, the showcase games."""
        if self.follower is not None:
            self.follower.start()
        if self.producer is not None:
            self.producer.start()
        if self.run_watch is not None:
            self.run_watch.start()
        if self.limits.showcase_every > 0 and self.env is not None:
            self._showcase = threading.Thread(target=self._play_showcase, name="showcase-games", daemon=True)
            self._showcase.start()

    def begin_close(self) -> None:
        """Stop playing and interrupt the engine: a batch in flight ends at its next token, and every game thread
        sees the stop before the engine's error. Returns at once (a server calls it from its signal handler)."""
        self._stop.set()
        if self.producer is not None:
            self.producer.stop()
        self.engine.interrupt()

    def close(self, timeout: float = 60.0, engine_timeout: float | None = None) -> None:
        """`begin_close`, then wait up to `timeout` s for the threads that play and follow, then close the env client
        and the engine (in that order), waiting up to `engine_timeout` s (None: as long as it takes) for a call in the
        engine."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        self.begin_close()
        if self.follower is not None:
            self.follower.close(left())
        if self._showcase is not None:
            self._showcase.join(left())
        if self.producer is not None:
            self.producer.close(left())
        if self.run_watch is not None:
            self.run_watch.close(left())
        if self.env is not None:
            self.env.close()
        self.engine.close(engine_timeout)

    # -- serving -------------------------------------------------------------------------------------

    def generate(self, prompts: Sequence[Prompt], params: SamplingParams) -> list[Completion]:
        """One completion per prompt, each stamped with its version. A trainer's call: public games wait while it runs.

        Raises:
            LimitExceededError: more prompts or tokens than the caps.
            ValueError, EngineError: as `Engine.generate`.
        """
        if not prompts:
            raise ValueError("no prompts given")
        self._check("max_batch", len(prompts), self.limits.max_batch, "--max-batch")
        self._check("max_tokens", params.max_tokens, self.limits.max_tokens, "--max-tokens")
        with self._gate.trainer():
            completions = self.engine.generate(prompts, params)
        self._count(sum(len(c.token_ids) for c in completions))
        return completions

    def play(
        self,
        games: Sequence[GameSpec],
        params: PlayParams | None = None,
        on_turn: Callable[[Sequence[Trajectory]], None] | None = None,
        *,
        public: bool = False,
    ) -> list[Trajectory]:
        """Play whole games with the current policy (`games.play_games`). The trainer's games (``public=False``) keep
        public play waiting; public games wait before each turn until no trainer request runs.

        Raises:
            LimitExceededError: more games or tokens per reply than the caps.
            RolloutError: no env Space configured; EnvUnavailableError: it failed.
        """
        params = params or PlayParams()
        if self.env is None:
            raise RolloutError("this rollout server has no env Space: start it with --env-url (or ENV_URL)")
        if not games:
            raise ValueError("no games given")
        self._check("max_games", len(games), self.limits.max_games, "--max-games")
        self._check("max_tokens", params.max_tokens, self.limits.max_tokens, "--max-tokens")
        start = time.monotonic()
        try:
            if public:
                trajectories = play_games(
                    BehindTrainer(self.engine, self._gate),  # type: ignore[arg-type]  # the engine behind a gate: the calls play_games makes
                    self.env,
                    games,
                    params,
                    on_turn,
                )
            else:
                with self._gate.trainer():
                    trajectories = play_games(self.engine, self.env, games, params, on_turn)
        finally:
            with self._stats_lock:
                self._busy_s += time.monotonic() - start
        with self._stats_lock:
            self._tokens += sum(sum(t.env_mask) for t in trajectories)
            self._straddled += sum(t.straddled for t in trajectories)
            if trajectories:
                self._versions_reported = all(t.versions_reported for t in trajectories)
            self._games.extend(trajectories)
            self._kinds.update((t.episode_id, spec.kind) for t, spec in zip(trajectories, games, strict=True))
            if len(self._kinds) > 2 * RECENT_GAMES:  # keep the kinds of the games still kept
                self._kinds = {t.episode_id: self._kinds[t.episode_id] for t in self._games}
            self._played += len(trajectories)
            self._last_game = time.monotonic()
        return trajectories

    # -- what the UI and /status show ------------------------------------------------------------------

    def status(self) -> RolloutStatus:
        """What ``GET /status`` answers: the version served, the bucket's latest, the lag, the engine, the last
        error, the hash of the weights served (comparable with the manifest's), and more."""
        following = self.follower.status() if self.follower is not None else {}
        latest = following.get("latest_version")
        refused_then = following.get("refused")
        refused = dict(refused_then) if isinstance(refused_then, dict) else {}
        last_refusal = following.get("last_refusal")
        fleet = self.producer.bucket if self.producer is not None else self.run_watch.bucket if self.run_watch else None
        if fleet is not None and fleet.runs_refused:
            refused["untrusted run settings"] = fleet.runs_refused
            last_refusal = last_refusal or fleet.run_refusal
        note = None
        if self.follower is None:
            note = "no bucket: serving the model as loaded"
        elif latest is None:
            note = "the bucket has no version yet: serving the model as given"
        with self._stats_lock:
            tokens, games, busy = self._tokens, self._played, self._busy_s
            straddles, reported = self._straddled, self._versions_reported
        bucket = self.follower.bucket if self.follower is not None else None
        url = bucket.url if bucket is not None else None
        error = following.get("last_error")
        producer = self.producer
        return RolloutStatus(
            version=self.engine.version,
            latest_version=latest,
            lag=following.get("lag"),
            engine=self.engine_kind,
            device=self.engine.config.device,
            model=public_location(self.model),  # /status is public: no folder of this machine on it
            bucket=public_location(url) if url is not None else None,
            bucket_traffic=bucket_traffic(bucket.traffic) if bucket is not None else None,
            env_url=self.env.url if self.env is not None else None,
            last_error=public_text(error if isinstance(error, str) else None, url, self.model),
            state_hash=following.get("state_hash") if self.engine.exact else None,  # not claimed for rounded weights
            failures=following.get("failures", 0),
            note=note,
            syncs=len(self.syncs()),
            tokens_served=tokens,
            games_played=games,
            straddled=straddles,
            versions_reported=reported,
            busy_s=round(busy, 3),
            server_id=producer.server_id if producer is not None else None,
            fleet_state=str(producer.state) if producer is not None else None,
            fleet_run=producer.run_id if producer is not None else None,
            groups_written=producer.groups_written if producer is not None else 0,
            lora=self.follower.lora if self.follower is not None else None,
            adapters=self.engine.adapter_support,
            refused=refused,
            last_refusal=last_refusal,
            trust=following.get("trust", ""),
            authenticated=following.get("authenticated", True),
        )

    def _served_hash(self) -> str | None:
        """The hash of the weights served, as verified against the manifest (None: not claimed, as in `status`)."""
        if self.follower is None or not self.engine.exact:
            return None
        digest = self.follower.status().get("state_hash")
        return digest if isinstance(digest, str) else None

    def syncs(self) -> list[SyncRecord]:
        """The latest versions applied, oldest first."""
        return self.follower.records() if self.follower is not None else []

    def last_delta(self) -> DeltaHeader | None:
        """The header of the last delta applied (which tensors changed, how many elements each)."""
        return self.follower.last_header() if self.follower is not None else None

    def recent_games(self, limit: int = 20) -> list[Trajectory]:
        """The latest games played (for the trainer or the showcase), newest first (finished: read, do not change)."""
        with self._stats_lock:
            return list(self._games)[::-1][:limit]

    def kinds(self) -> dict[str, GameKind]:
        """Why each of the latest games was played (`GameSpec.kind`), by episode id: the feed labels each."""
        with self._stats_lock:
            return dict(self._kinds)

    # -- internals -------------------------------------------------------------------------------------

    def _check(self, limit: str, value: int, cap: int, flag: str) -> None:
        if value > cap:
            raise LimitExceededError(limit, value, cap, flag)

    def _count(self, tokens: int) -> None:
        with self._stats_lock:
            self._tokens += tokens

    def _play_showcase(self) -> None:
        """Play one game whenever none was played for `showcase_every` seconds."""
        while not self._stop.wait(1.0):
            if time.monotonic() - self._last_game < self.limits.showcase_every:
                continue
            try:
                showcase = GameSpec(kind=GameKind.SHOWCASE)
                self.play([showcase], PlayParams(max_tokens=min(48, self.limits.max_tokens)), public=True)
            except Exception as e:  # noqa: BLE001 - the env may be down for a while; the Space keeps serving
                if self._stop.is_set():  # the engine was interrupted under the game: the server is stopping
                    return
                logger.warning("showcase game failed: %s", e)
                self._last_game = time.monotonic()
