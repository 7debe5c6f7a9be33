"""The rollout server's exams: when the run's settings ask, play the held-out secrets without the env's examples with
the weights held, and write the record to the bucket (`wire.exam`).

`Examiner` carries out what the producer chooses (`choices.choose`): whether an exam is due for the version held,
taking it, keeping version 0 for its exam or letting it go. An exam is due at version 0 and at the first version
held in each later block of `ExamSettings.every` versions, judged against the newest record at or below it,
whoever wrote it. The weights are held for the exam (`Follower.holding`); exam games are never trained on. A failed
exam is logged and tried again after `choices.EXAM_RETRY_S`."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from fleet.exams import ExamShelf
from wire.env import GameKind
from wire.errors import RolloutError
from wire.exam import ExamRecord, ExamScores, ExamSettings
from wire.fleet import RunSettings
from wire.trajectory import Trajectory

from .choices import EXAM_RETRY_S
from .env_client import EnvClient
from .games import GameSpec, PlayParams

logger = logging.getLogger(__name__)


class Examiner:
    """Plays and records exams for one rollout server, and keeps version 0 for its exam, as the producer chooses.

    Args:
        play: Plays whole games with the current policy (`RolloutService.play`, trainer priority).
        version: The weight version served now.
        state_hash: The hash of the weights served, verified against the manifest (None: not claimed).
        env: The env's client (its ``GET /exam`` gives the copying reference).
        shelf: The bucket's exam records.
        server_id: This server's name, written into each record.
        hold: Keeps the served version while an exam plays (`Follower.holding`).

    Attributes:
        records: The bucket's exam records as last read, by version.
        last_error: The last failure, with its time.
    """

    def __init__(
        self,
        play: Callable[[Sequence[GameSpec], PlayParams], list[Trajectory]],
        version: Callable[[], int],
        state_hash: Callable[[], str | None],
        env: EnvClient,
        shelf: ExamShelf,
        server_id: str,
        hold: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> None:
        self.play = play
        self.version = version
        self.state_hash = state_hash
        self.env = env
        self.shelf = shelf
        self.server_id = server_id
        self.hold = hold
        self.records: list[ExamRecord] = []
        self.last_error: str | None = None
        self._references: dict[tuple[int, int], ExamScores] = {}
        self._lock = threading.Lock()
        self._kept: contextlib.ExitStack | None = None  # version 0 held for its exam (`keep`, `let_go`)
        self._playing: int | None = None  # the version whose exam plays now

    def activity(self) -> str | None:
        """What the examiner does now, in words for a page: playing an exam, or keeping version 0 for its exam until
        the trainer's first step is published; None: neither."""
        if self._playing is not None:
            return f"playing the exam of v{self._playing} (held-out words, no examples)"
        if self._kept is not None:
            return "the exam of v0, the untrained policy, waits for the trainer's first step (v0 is kept for it)"
        return None

    def latest(self, version: int | None = None) -> ExamRecord | None:
        """The newest exam of a version at most `version` (None: of any version), as last read."""
        exams = [r for r in self.records if version is None or r.version <= version]
        return exams[-1] if exams else None

    @property
    def kept(self) -> bool:
        """Whether version 0 is kept for its exam (`keep`)."""
        return self._kept is not None

    def due(self, run: RunSettings, version: int) -> bool:
        """Whether an exam of weight `version` is due, against the bucket's exam records read now (kept in `records`).

        Raises:
            OSError, delta.StorageError: the records could not be listed.
        """
        if run.exam is None:
            return False
        self.records = self.shelf.records()
        last = self.latest(version)
        return run.exam.due(version, last.version if last is not None else None)

    def keep(self) -> None:
        """Keep the version served (version 0) loaded until `let_go`, for its exam; kept already, it stays kept. Call
        it and `let_go` from one thread (the hold is that thread's)."""
        if self._kept is None:
            self._kept = contextlib.ExitStack()
            self._kept.enter_context(self.hold())
            logger.info("the exam of v0 waits for the trainer's first step (v0 is kept for it meanwhile)")

    def let_go(self) -> None:
        """Let go of the version kept for its exam (if any): the server follows the bucket again."""
        if self._kept is not None:
            self._kept.close()
            self._kept = None
            logger.info("v0, kept for its exam, let go: this server follows the bucket again")

    def failed(self, error: Exception) -> None:
        """Note an exam, or a read of the records for one, that failed: logged and kept in `last_error` (the producer
        tries again after `EXAM_RETRY_S`)."""
        self.last_error = f"{time.strftime('%H:%M:%S')} {type(error).__name__}: {error}"
        logger.warning("the exam failed (retried in %.0f s): %s", EXAM_RETRY_S, error)

    def take(self, run: RunSettings) -> ExamRecord:
        """Play the exam now with the weights held, write its record to the bucket and return it.

        Raises:
            RolloutError: the env did not play the exam as asked; EnvUnavailableError (a RolloutError): it failed.
            OSError, delta.StorageError: the record could not be written.
        """
        settings = run.exam or ExamSettings()
        copying = self._reference(settings)
        params = PlayParams(
            max_tokens=run.sampling.max_tokens,
            temperature=settings.temperature,
            max_turns=settings.turns,
            seed=settings.seed,
            reply_prefix=run.sampling.reply_prefix,
            examples=0.0,
        )
        with self._lock, self.hold():
            version, state_hash = self.version(), self.state_hash()
            start = time.monotonic()
            self._playing = version
            try:
                games = self.play([GameSpec(exam=i, kind=GameKind.EXAM) for i in range(settings.games)], params)
            finally:
                self._playing = None
            played_s = time.monotonic() - start
        check_exam_games(games, version)
        record = ExamRecord(
            version=version,
            state_hash=state_hash,
            server_id=self.server_id,
            settings=settings,
            scores=ExamScores.of(games),
            copying=copying,
            played_s=round(played_s, 3),
            at=time.time(),
        )
        self.shelf.write(record)
        self.records = sorted([r for r in self.records if r.version != version] + [record], key=lambda r: r.version)
        self.last_error = None
        s = record.scores
        logger.info(
            "exam of v%d: own words %.0f%% of moves (valid %.0f%%), letters %.2f, %d wins, in %.0f s",
            version,
            100 * s.own_rate,
            100 * s.valid_rate,
            s.letters,
            s.wins,
            played_s,
        )
        return record

    def _reference(self, settings: ExamSettings) -> ExamScores:
        key = (settings.games, settings.turns)
        if key not in self._references:
            self._references[key] = self.env.exam_info(*key).copying
        return self._references[key]


def check_exam_games(games: Sequence[Trajectory], version: int) -> None:
    """Raise RolloutError unless every game is an exam game without any example shown, every reply of
    weight `version`."""
    for game in games:
        if not game.exam or any(game.examples):
            raise RolloutError(
                f"the env showed example words in exam game {game.episode_id}: it does not take "
                "examples: false (an env of an older version?)"
            )
        if any(v != version for v in game.versions):
            raise RolloutError(
                f"exam game {game.episode_id} was played by versions {sorted(set(game.versions))}, not {version} alone"
            )
