"""A game group checked against the run it claims to belong to, as a delta is checked against its base.

`wire.fleet.decode` checks what a group alone can show (types, finite logprobs at most 0, bounded rewards,
masks of 0 and 1, one logprob and mask entry per token). What only the run's settings can show is checked
here, before the trainer queues the group: its size in bytes (before it is parsed: `max_group_bytes`), the
number of games, token ids within the vocabulary, the turns and tokens each game may hold, and weight
versions no newer than the trainer's. A group that fails is refused and counted under its `Refusal`.
"""

from __future__ import annotations

from .fleet import FleetMessageError, GameGroup, Refusal, RunSettings
from .trajectory import Trajectory

#: Bytes of JSON a game may take per token of it (the token id, its logprob and mask entry, and its share of
#: the reply's text, escaped), and besides its tokens (ids, rewards, words, errors): generous bounds, so that
#: only a group far larger than its games could be is refused unread.
BYTES_PER_TOKEN = 256
BYTES_PER_GAME = 64 << 10


def max_group_bytes(run: RunSettings) -> int:
    """The largest file a valid group of `run` can be: larger ones are refused before they are read whole."""
    return 4096 + run.num_generations * (BYTES_PER_GAME + BYTES_PER_TOKEN * run.max_game_tokens)


def check_group(group: GameGroup, run: RunSettings, newest_version: int, path: str) -> None:
    """Refuse a group that does not fit `run`: the run's group size, token ids below its vocabulary (when the
    settings say it), at most `max_turns` replies of at most `max_tokens` tokens each, at most `max_game_tokens`
    tokens in all, and no reply played by a version newer than `newest_version` (the trainer's).

    Raises:
        FleetMessageError: with the `Refusal` it counts as.
    """
    if group.run_id != run.run_id:
        raise FleetMessageError(path, f"of run {group.run_id}, not {run.run_id}", Refusal.ANOTHER_RUN)
    if len(group.games) != run.num_generations:
        raise FleetMessageError(
            path, f"{len(group.games)} games, the run's groups hold {run.num_generations}", Refusal.SHAPE
        )
    for i, game in enumerate(group.games):
        _check_game(game, run, newest_version, f"{path}: game {i}")


def _check_game(game: Trajectory, run: RunSettings, newest: int, where: str) -> None:
    tokens = len(game.prompt_ids) + len(game.completion_ids)
    if tokens > run.max_game_tokens:
        raise FleetMessageError(where, f"{tokens} tokens, more than the run's {run.max_game_tokens}", Refusal.SHAPE)
    if run.vocab_size is not None:
        top = max(max(game.prompt_ids, default=0), max(game.completion_ids, default=0))
        if top >= run.vocab_size:
            raise FleetMessageError(
                where, f"token id {top}, the run's vocabulary holds {run.vocab_size}", Refusal.VOCABULARY
            )
    turns, cap = len(game.versions), run.sampling.max_turns
    if turns > cap or len(game.turn_rewards) > cap or len(game.replies) > cap:
        raise FleetMessageError(
            where,
            f"{max(turns, len(game.turn_rewards), len(game.replies))} replies, the run plays at most {cap}",
            Refusal.SHAPE,
        )
    longest = max(_model_runs(game.env_mask), default=0)
    if longest > run.sampling.max_tokens or sum(game.env_mask) > turns * run.sampling.max_tokens:
        raise FleetMessageError(
            where,
            f"{sum(game.env_mask)} model tokens in {turns} replies (a run of {longest}); "
            f"a reply holds at most {run.sampling.max_tokens}",
            Refusal.SHAPE,
        )
    if game.newest_version > newest:
        raise FleetMessageError(
            where, f"a reply of weight version {game.newest_version}, newer than the trainer's {newest}", Refusal.AHEAD
        )


def _model_runs(mask: list[int]) -> list[int]:
    """Lengths of the runs of the model's own tokens (1s) in a game's mask."""
    runs, length = [], 0
    for m in mask:
        if m:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs + [length] if length else runs
