""" "Play against the policy": a person and the policy on the same secret word, side by side.

Both games take the same env ``seed``, so the env picks the same word for both and neither side
ever sends it. The person's game goes to the env Space through the rollout's `EnvClient` (with its
env token: the env's reserved pool; the rollout caps its visitors itself); the policy's game is a
callable (the rollout service's ``play``) run on an executor while the person types. The secret
stays on the server: the env reveals it only when the person's game ends, and the policy's board is
drawn with colours only until then.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass

from dashboard import games, render
from dashboard.exam import opponent_text
from dashboard.labels import counted
from wire.env import GameKind, WordleObservation
from wire.exam import ExamRecord
from wire.rollout import Trajectory

from .env_client import EnvClient
from .errors import EnvUnavailableError

#: Receives the policy's game so far (a copy it may keep) after each of its turns.
Progress = Callable[[Trajectory], None]
#: Plays one game with the policy on the env's word for ``seed``, reporting each turn to the
#: :data:`Progress` it is given; returns the finished trajectory.
PlayOne = Callable[[int, Progress], Trajectory]

MAX_SEED = 2**31 - 1


class VersusError(RuntimeError):
    """The env Space refused or did not answer the person's game."""


class MatchClosed(RuntimeError):
    """Raised into the policy's game at its next turn once its match was closed: the game stops there."""


@dataclass(frozen=True)
class Opponent:
    """What the page says of the policy before a match's first move, fixed as the match starts: the version served
    then (`version`), the latest exam up to it (`exam`), the probability that its messages show the env's example
    word (`examples`), and the most moves its game may take (`max_moves`). The version that plays is the policy
    game's own (each reply records it), named once it moved."""

    version: int
    exam: ExamRecord | None
    examples: float
    max_moves: int


@dataclass(frozen=True)
class VersusView:
    """What the UI shows of a match: HTML of both boards, one status line each and the opponent line (Markdown)."""

    human_board: str
    keyboard: str
    human_status: str
    policy_board: str
    policy_status: str
    opponent: str


class Match:
    """One match. Not thread-safe: one visitor's session drives it (keep it in ``gr.State``).

    Args:
        env: The env Space's client (shared; matches never close it).
        play: Plays the policy's game (see :data:`PlayOne`); runs on ``executor``.
        executor: Where the policy's game runs (bounded by its workers).
        opponent: What the page says of the policy before its first move.
        seed: The env seed both games share; random when None.
        clock: Monotonic seconds (the policy's pace per move is measured with it).

    Raises:
        VersusError: the env did not start the person's game.
    """

    def __init__(
        self,
        env: EnvClient,
        play: PlayOne,
        executor: Executor,
        opponent: Opponent,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = random.randint(0, MAX_SEED) if seed is None else seed
        self.opponent = opponent
        self._closed = False
        self._env = env
        self._clock = clock
        self._began: float | None = None  # when the policy's game started playing
        self._moved: float | None = None  # when its last move came in
        try:
            self.human = env.reset(seed=self.seed, human=True, kind=GameKind.MATCH)
        except EnvUnavailableError as e:
            raise VersusError(str(e)) from e
        self._so_far: Trajectory | None = None
        self.policy: Future[Trajectory] = executor.submit(self._play, play)

    def _play(self, play: PlayOne) -> Trajectory:
        self._began = self._clock()
        return play(self.seed, self._progress)

    def _progress(self, game: Trajectory) -> None:
        if self._closed:
            raise MatchClosed("the match was closed: its policy game stops here")
        self._moved = self._clock()
        self._so_far = game  # one reference swapped from the policy's thread; the UI reads it

    def guess(self, word: str) -> WordleObservation:
        """Play the person's next word (invalid words are explained and cost nothing)."""
        if not self.human.done:
            try:
                self.human = self._env.step(self.human.episode_id, word)
            except EnvUnavailableError as e:
                raise VersusError(str(e)) from e
        return self.human

    def policy_game(self) -> Trajectory | None:
        """The policy's finished game, or None while it plays. Raises what ``play`` raised."""
        return self.policy.result() if self.policy.done() else None

    def view(self) -> VersusView:
        """Both boards: the policy's rows appear as the person plays theirs, in colour only, and in
        full with the word and what it wrote for each move once the person's game is over; its invalid moves
        show as they come, without their text until then."""
        rows = self.human.rows
        over = self.human.done
        opponent = self.opponent_text()
        if self.policy.cancelled():
            return VersusView(
                render.board_html(rows),
                render.keyboard_html(rows),
                render.status_text(self.human),
                games.board_html(None),
                "This match was closed.",
                opponent,
            )
        failure = self.policy.exception() if self.policy.done() else None  # shown, the match goes on
        policy = None if failure or not self.policy.done() else self.policy.result()
        if failure:
            policy_status = f"The policy could not play: {type(failure).__name__}: {failure}"
        elif policy is None:
            policy_status = self._playing_text()
        elif over:
            policy_status = f"Policy {games.version_label(policy)}: {games.result_text(policy)}."
        else:
            shown, scored = min(len(rows), len(policy.marks)), len(policy.marks)
            policy_status = (
                f"Policy {games.version_label(policy)} has played: {counted(len(policy.replies), 'move')}, "
                f"{scored} scored, {len(policy.replies) - scored} invalid. Its scored rows show in colour as you play "
                f"yours ({shown} of {scored} so far)."
            )
        game = policy or self._so_far
        board = games.board_html(game, rows=None if over else len(rows), hide_letters=not over)
        if over and policy is not None:  # its words are no secret any more: what it wrote, move by move
            board += render.moves_html(
                policy.replies,
                policy.guesses,
                open_=True,
                errors=policy.errors,
                examples=policy.examples,
                copied=policy.copied,
            )
        elif game is not None:
            board += games.move_track_html(game)
        return VersusView(
            render.board_html(rows),
            render.keyboard_html(rows),
            render.status_text(self.human),
            board,
            policy_status,
            opponent,
        )

    def opponent_text(self) -> str:
        """The opponent line: the versions that played the policy's moves once it moved (before: the version served
        as the match began, said as such), its latest exam as the match began, and its examples."""
        finished = self.policy.done() and not self.policy.cancelled() and self.policy.exception() is None
        game = self.policy.result() if finished else self._so_far
        if game is None or not game.versions:
            who = f"the policy as served when its first move is played (v{self.opponent.version} as this match began)"
        else:
            who = f"**policy {games.version_label(game)}**" + (
                " (new weights arrived during its game)" if len(set(game.versions)) > 1 else ""
            )
        return opponent_text(who, self.opponent.exam) + " " + examples_sentence(self.opponent.examples)

    def _playing_text(self) -> str:
        """The policy's side while it plays: how far it got, its pace here, and what is left to expect."""
        if self._began is None:
            return (
                "The policy's game is queued: visitors' policy games are played one at a time. Its moves then run "
                "between the trainer's games, which go first."
            )
        game = self._so_far
        moves = len(game.replies) if game else 0
        if not moves:
            return (
                "The policy is thinking about its first move. Its moves run between the trainer's games, which go "
                "first: on a busy machine a move can take a while."
            )
        invalid = sum(1 for g in game.guesses if not g) if game else 0
        pace = ((self._moved or self._began) - self._began) / moves
        left = max(0, self.opponent.max_moves - moves)
        return (
            f"The policy is playing: {counted(moves, 'move')} so far ({moves - invalid} scored, {invalid} invalid), "
            f"about {pace:.0f} s a move on this machine. Invalid moves use up no guess, so its game may take up to "
            f"{counted(left, 'more move')}"
            + (f", about {left * pace / 60:.0f} more minutes at this pace." if left * pace >= 90 else ".")
        )

    def close(self) -> None:
        """Drop the person's game if unfinished, and the policy's: a queued one never starts, a running
        one stops at its next turn (its env game is closed as it stops)."""
        self._closed = True
        self.policy.cancel()
        if not self.human.done:
            self._env.close_game(self.human.episode_id)  # best effort: the env drops idle games itself


def examples_sentence(probability: float) -> str:
    """What the match says, before its first move, of the env's example words the policy is shown."""
    if probability <= 0:
        return "Its messages show no example word: it plays by itself, as in its exam."
    share = "every message" if probability >= 1 else f"about {100 * probability:.0f}% of its messages"
    return (
        f"Unlike its exam, it is shown the env's example word (never the secret) in {share}: a small policy copies "
        "it, and once your game is over each move it copied says so."
    )


class PrivateGames:
    """Plays the policy's side of matches and keeps those games out of the public feed.

    A match's policy game lands in the service's recent games (with its secret) as soon as it ends,
    while the person may still be guessing the same word. ``visible`` filters those games out; while
    one is still being played it returns None (the caller keeps its last feed), so no game can show
    between its end and its registration here. Thread-safe.

    Args:
        play: Plays one policy game on the env's word for a seed; the result has ``episode_id``.
        limit: How many match games to remember (older ones may show in the feed again).
    """

    def __init__(self, play: PlayOne, limit: int = 512) -> None:
        self._play = play
        self._lock = threading.Lock()
        self._ids: deque[str] = deque(maxlen=limit)
        self._in_flight = 0
        self._changes = 0

    def play(self, seed: int, progress: Progress) -> Trajectory:
        """Play one game and remember it as private (the :data:`PlayOne` of a :class:`Match`)."""
        with self._lock:
            self._in_flight += 1
            self._changes += 1
        game: Trajectory | None = None
        try:
            game = self._play(seed, progress)
            return game
        finally:
            with self._lock:
                if game is not None:
                    self._ids.append(game.episode_id)
                self._in_flight -= 1
                self._changes += 1

    @property
    def changes(self) -> int:
        """Grows on every start and end of a match game: a cheap key for redrawing the feed."""
        return self._changes

    def visible(self, games: Sequence[Trajectory]) -> list[Trajectory] | None:
        """``games`` without match games; None while a match game is being played."""
        with self._lock:
            if self._in_flight:
                return None
            hidden = set(self._ids)
        return [g for g in games if g.episode_id not in hidden]
