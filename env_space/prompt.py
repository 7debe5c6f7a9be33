"""Text for language models: the game instructions, the feedback after each move, and the parser
that pulls a guess out of free model output."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from .rules import MAX_GUESSES, WORD_LENGTH, Mark

_MARK_WORDS = {Mark.GREEN: "green", Mark.YELLOW: "yellow", Mark.GRAY: "gray"}
_MARK_TILES = {Mark.GREEN: "🟩", Mark.YELLOW: "🟨", Mark.GRAY: "⬛"}

#: The tag a guess opens with. A player may write it for a model (see `rollout_space.games.PlayParams`).
OPEN_TAG = "<guess>"

INSTRUCTIONS = f"""Let's play Wordle. Find the secret {WORD_LENGTH}-letter English word in at most \
{MAX_GUESSES} guesses.
After each guess you get feedback for every letter:
- green: the letter is in the word, in that spot;
- yellow: the letter is in the word, in another spot;
- gray: the letter is not in the word (or not as many times as you used it).
Every guess must be a real {WORD_LENGTH}-letter English word. Think briefly, then write your guess \
inside <guess></guess> tags, for example <guess>crane</guess>.
Make your first guess."""

# A closing tag may be missing: generation often stops on "</guess>" as a stop string.
_TAGGED = re.compile(r"<guess>(.*?)(?:</guess>|(?=<guess>)|$)", re.IGNORECASE | re.DOTALL)
_THINKING = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
_EDGE_PUNCTUATION = "\"'`*_.,;:!?()[]{}<>"


@dataclass(frozen=True)
class ParsedGuess:
    """What the parser found: a lowercase candidate word (not yet checked against the word list),
    whether it came from ``<guess>`` tags, or why nothing was found."""

    word: str | None
    tagged: bool
    error: str | None = None


def parse_guess(text: str) -> ParsedGuess:
    """Extract the guess from model output; never raises.

    The last ``<guess>...</guess>`` outside ``<think>`` blocks wins; tags are case-insensitive and
    the closing tag is optional. Inside the tags extra words are tolerated: the last token of
    the right length is taken. Without tags, a reply that is a single word is accepted (marked
    untagged); anything else is a format error.
    """
    visible = _THINKING.sub(" ", text)
    tagged = _TAGGED.findall(visible)
    if tagged:
        tokens = _tokens(tagged[-1])
        if not tokens:
            return ParsedGuess(None, True, "the <guess></guess> tags are empty")
        sized = [t for t in tokens if len(t) == WORD_LENGTH]
        return ParsedGuess((sized or tokens)[-1], True)
    tokens = _tokens(visible)
    if len(tokens) == 1:
        return ParsedGuess(tokens[0], False)
    return ParsedGuess(
        None,
        False,
        f"no guess found; write one {WORD_LENGTH}-letter word inside <guess></guess>, "
        "for example <guess>crane</guess>",
    )


def _tokens(text: str) -> list[str]:
    stripped = (t.strip(_EDGE_PUNCTUATION).lower() for t in text.split())
    return [t for t in stripped if t]


def feedback_line(word: str, marks: Sequence[Mark]) -> str:
    """One scored guess as a model reads it: tiles plus the mark of every letter in words."""
    letters = ", ".join(f"{c.upper()} {_MARK_WORDS[m]}" for c, m in zip(word, marks, strict=True))
    tiles = "".join(_MARK_TILES[m] for m in marks)
    return f"{word.upper()} {tiles} ({letters})."


def invalid_line(error: str) -> str:
    """Why a move was rejected; invalid moves do not use up a guess."""
    return f"Invalid move: {error}. It did not use up a guess."


def next_move_text(guesses_left: int) -> str:
    """The request for the next guess."""
    plural = "es" if guesses_left != 1 else ""
    return f"You have {guesses_left} guess{plural} left. Reply with your next guess inside <guess></guess>."


def result_text(won: bool, secret: str, guesses_used: int, too_many_invalid: bool = False) -> str:
    """The closing message of a game."""
    if won:
        plural = "es" if guesses_used != 1 else ""
        return f"You won: the word was {secret.upper()}, found in {guesses_used} guess{plural}."
    reason = "too many invalid moves" if too_many_invalid else "no guesses left"
    return f"Game over ({reason}): the word was {secret.upper()}."
