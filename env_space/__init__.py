"""The Wordle environment Space: word lists, prompt and parser, rewards, sessions, HTTP API and Gradio UI.
The rules and the HTTP messages, which the other apps share, are ``wire.wordle`` and ``wire.env`` (re-exported
here); the board's drawing is ``dashboard.render``. Importing the package loads no web framework;
``env_space.server`` does."""

from wire.env import HUMAN, GameRecord, PlayerStats, WordleAction, WordleObservation, player_label
from wire.wordle import MAX_GUESSES, WORD_LENGTH, Mark, letter_states, score

from .errors import (
    GameOverError,
    InvalidSecretError,
    ServerFullError,
    SessionExistsError,
    SessionNotFoundError,
    WordleError,
)
from .game import WordleGame
from .history import GameHistory
from .prompt import INSTRUCTIONS, ParsedGuess, parse_guess
from .rewards import DEFAULT_REWARDS, RewardConfig
from .sessions import SessionLimits, SessionStore
from .words import WordLists, load_word_lists

__all__ = [
    "DEFAULT_REWARDS",
    "HUMAN",
    "INSTRUCTIONS",
    "MAX_GUESSES",
    "WORD_LENGTH",
    "GameHistory",
    "GameOverError",
    "GameRecord",
    "InvalidSecretError",
    "Mark",
    "ParsedGuess",
    "PlayerStats",
    "RewardConfig",
    "ServerFullError",
    "SessionExistsError",
    "SessionLimits",
    "SessionNotFoundError",
    "SessionStore",
    "WordLists",
    "WordleAction",
    "WordleError",
    "WordleGame",
    "WordleObservation",
    "letter_states",
    "load_word_lists",
    "parse_guess",
    "player_label",
    "score",
]
