"""`python app.py env`: the Wordle environment's flags (defaults from the Space's environment variables) and
start-up."""

from __future__ import annotations

import argparse
import logging
import os

import settings
from env_space.rewards import DEFAULT_REWARDS, RewardConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The env role's flags; host and port default to the variables a Space sets."""
    settings.add_server_arguments(parser)
    parser.add_argument(
        "--token",
        default=settings.ENV_TOKEN.value(),
        help="secret the rollout sends (env ENV_TOKEN): its games get their own reserved pool and "
        "may name the policy's weight version; unset: every caller is anonymous",
    )
    parser.add_argument(
        "--max-sessions", type=_at_least_one, default=1024, help="live games of token holders at most (default 1024)"
    )
    parser.add_argument(
        "--session-ttl",
        type=_positive_seconds,
        default=600.0,
        help="idle seconds before a token holder's game is dropped (default 600)",
    )
    parser.add_argument(
        "--public-sessions",
        type=_at_least_one,
        default=256,
        help="live games of anonymous visitors at most, all together (default 256)",
    )
    parser.add_argument(
        "--per-client",
        type=_at_least_one,
        default=4,
        help="live games of one anonymous visitor (by address) at most (default 4)",
    )
    parser.add_argument(
        "--public-ttl",
        type=_positive_seconds,
        default=180.0,
        help="idle seconds before an anonymous visitor's game is dropped (default 180)",
    )
    parser.add_argument(
        "--own-word-reward",
        type=float,
        default=DEFAULT_REWARDS.own_word,
        help="reward term of a legal guess no message of the game had shown (the player's own "
        f"word; default {DEFAULT_REWARDS.own_word}; see docs/spaces.md, Rewards)",
    )
    parser.add_argument(
        "--five-letter-reward",
        type=_penalty_part,
        default=DEFAULT_REWARDS.five_letters,
        help="given back of the invalid-word penalty for five letters a-z outside the word list (a "
        f"word's shape; default {DEFAULT_REWARDS.five_letters}, at most "
        f"{-DEFAULT_REWARDS.invalid_word:g}; see docs/spaces.md, Rewards)",
    )


def _at_least_one(text: str) -> int:
    """An int >= 1, for argparse (its error then names the flag)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _penalty_part(text: str) -> float:
    """A `RewardConfig.five_letters` that the config takes, for argparse (its error then names the flag)."""
    value = float(text)
    try:
        RewardConfig(five_letters=value)  # the bound lives there
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be from 0 to {-DEFAULT_REWARDS.invalid_word:g} (a non-word never earns), got {value:g}"
        ) from None
    return value


def _positive_seconds(text: str) -> float:
    """A float > 0, for argparse (its error then names the flag)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value}")
    return value


def run(args: argparse.Namespace) -> None:
    """Serve the UI and the HTTP API on one port until interrupted. Blocks.

    Raises:
        ValueError: a session limit or a reward out of range (the message names the setting).
    """
    from .api import Access
    from .server import serve
    from .sessions import SessionLimits

    if not args.token:
        logging.getLogger(__name__).warning(
            "no env token (--token / ENV_TOKEN): every caller may fill the sessions and label games as the "
            "policy's; set one on a public Space (python app.py and spaces/deploy.py do)"
        )
    limits = SessionLimits(args.max_sessions, args.session_ttl, args.public_sessions, args.per_client, args.public_ttl)
    # A Space (SPACE_ID set) is reached only through its proxy, whose X-Forwarded-For can be trusted.
    rewards = RewardConfig(own_word=args.own_word_reward, five_letters=args.five_letter_reward)
    serve(args.host, args.port, limits, Access(args.token, trust_forwarded=bool(os.environ.get("SPACE_ID"))), rewards)
