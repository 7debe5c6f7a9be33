"""Text for language models: the game instructions, the feedback after each move, and the strict
parser that reads the guess a reply makes."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from wire.wordle import CLOSE_TAG, MAX_GUESSES, OPEN_TAG, WORD_LENGTH, Mark

_MARK_WORDS = {Mark.GREEN: "green", Mark.YELLOW: "yellow", Mark.GRAY: "gray"}
_MARK_TILES = {Mark.GREEN: "🟩", Mark.YELLOW: "🟨", Mark.GRAY: "⬛"}


#: The instructions' example guess (each later request shows its own: `next_move_text`).
FIRST_EXAMPLE = "crane"


def instructions(example: str | None = FIRST_EXAMPLE) -> str:
    """The first message of a game: the rules, and the format with `example` as its example guess (None: a
    session without examples, `env_space.curriculum`, names no word)."""
    shown = f", for example <guess>{example}</guess>" if example else ""
    return f"""Let's play Wordle. Find the secret {WORD_LENGTH}-letter English word in at most \
{MAX_GUESSES} guesses.
After each guess you get feedback for every letter:
- green: the letter is in the word, in that spot;
- yellow: the letter is in the word, in another spot;
- gray: the letter is not in the word (or not as many times as you used it).
Every guess must be a real {WORD_LENGTH}-letter English word. Think briefly, then write your guess \
inside <guess></guess> tags{shown}.
Make your first guess."""


INSTRUCTIONS = instructions()


_OPEN = re.compile(re.escape(OPEN_TAG), re.IGNORECASE)
_THINKING = re.compile(r"<think>.*?(?:</think>|$)", re.IGNORECASE | re.DOTALL)
#: What ends the first word after the tag: whitespace, or the start of a tag ("crane</guess>").
_WORD = re.compile(r"[^\s<]+")
_EDGE_PUNCTUATION = "\"'`*_.,;:!?()[]{}<>"


@dataclass(frozen=True)
class ParsedGuess:
    """What the parser found: a lowercase candidate word (not yet checked against the word list),
    whether it came after a ``<guess>`` tag, whether that tag was left open, or why nothing was found."""

    word: str | None
    tagged: bool
    error: str | None = None
    left_open: bool = False


def parse_guess(text: str) -> ParsedGuess:
    """The guess a reply makes, by the strict rule (the same for people, policies and tests); never raises.

    ``<think>`` blocks are dropped. Then the guess is the first word after the last ``<guess>`` tag
    (case-insensitive), whether or not ``</guess>`` closes it: ``<guess>slate</guess> and more`` is
    SLATE, ``<guess>crane (no particular rules`` is CRANE, ``<guess> The next guess is Hercubunk`` is
    THE (which the word check then refuses). Punctuation at the word's edges is dropped. Without a tag,
    a reply that is one single word is that guess (marked untagged); anything else has no guess. Text
    around a guess is never searched for a word: a lenient parser makes the valid-guess rate rise while
    the policy learns nothing.
    """
    visible = _THINKING.sub(" ", text)
    openings = list(_OPEN.finditer(visible))
    if openings:
        opening = openings[-1]
        after = visible[opening.end() :]
        left_open = CLOSE_TAG not in after.lower()
        first = _WORD.search(after.split("<", 1)[0])  # a word ends at a tag: "crane</guess>"
        word = first.group().strip(_EDGE_PUNCTUATION).lower() if first else ""
        if not word:
            empty = f"nothing follows the {OPEN_TAG} tag" if left_open else "the <guess></guess> tags are empty"
            return ParsedGuess(None, True, empty, left_open)
        return ParsedGuess(word, True, None, left_open)
    tokens = [t for t in (t.strip(_EDGE_PUNCTUATION).lower() for t in visible.split()) if t]
    if len(tokens) == 1:
        return ParsedGuess(tokens[0], False)
    # No example word here: the request after it names the one example of the move (none in a game without them).
    return ParsedGuess(None, False, f"no guess found; write one {WORD_LENGTH}-letter word inside <guess></guess>")


def feedback_line(word: str, marks: Sequence[Mark]) -> str:
    """One scored guess as a model reads it: tiles plus the mark of every letter in words."""
    letters = ", ".join(f"{c.upper()} {_MARK_WORDS[m]}" for c, m in zip(word, marks, strict=True))
    tiles = "".join(_MARK_TILES[m] for m in marks)
    return f"{word.upper()} {tiles} ({letters})."


def invalid_line(error: str) -> str:
    """Why a move was rejected; invalid moves do not use up a guess."""
    return f"Invalid move: {error}. It did not use up a guess."


def next_move_text(guesses_left: int, example: str | None) -> str:
    """The request for the next guess, with an example of the format (None: without one).

    The example is a different word each move (`WordLists.example`): a small model copies the words its
    context shows, and with the first message's example as the only word in sight it repeated it on every
    move. The example says nothing about the secret.
    """
    plural = "es" if guesses_left != 1 else ""
    shown = f", for example <guess>{example}</guess>" if example else ""
    return f"You have {guesses_left} guess{plural} left. Reply with your next guess inside <guess></guess>{shown}."


def result_text(won: bool, secret: str, guesses_used: int, too_many_invalid: bool = False) -> str:
    """The closing message of a game."""
    if won:
        plural = "es" if guesses_used != 1 else ""
        return f"You won: the word was {secret.upper()}, found in {guesses_used} guess{plural}."
    reason = "too many invalid moves" if too_many_invalid else "no guesses left"
    return f"Game over ({reason}): the word was {secret.upper()}."
