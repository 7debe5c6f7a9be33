"""The env's example words in training games, as two figures with one definition each, worded alike on the
trainer's page and the landing page (`example_rows`).

- **examples shown** (`SHOWN`): measured. Over the games trained on in the last `WINDOW` steps, the share of the
  messages before a move that showed the env's example word, beside what the run's schedule gave those same games
  (`StepRecord.examples_scheduled`).
- **example schedule now** (`SCHEDULE`): the rule. The probability the run's schedule gives a game started now,
  by the trainer's version.

Why both, and why they differ: a game shows examples with the probability of the version that starts it
(`wire.curriculum`), and the fleet plays ahead of the trainer within the staleness bound, so the games trained on
were started by versions one or two behind the trainer's; on a falling schedule they got more examples than the
schedule gives now. A step's share is drawn from few messages (two words of three moves with the defaults), so
the measured share scatters around what the schedule gave its games. Shown under one name for one number, a
page compared the schedule now with the share shown over five steps and looked as though the games got more
examples than the run said.

Pure Python (the landing page imports it without a UI stack).
"""

from __future__ import annotations

from collections.abc import Sequence

from wire.curriculum import ExampleSchedule
from wire.trainer import StepRecord, TrainerStatus

from .trend import WINDOW

#: The measured figure's name, on every page.
SHOWN = f"examples shown, last {WINDOW} steps"
#: The rule's figure's name, on every page.
SCHEDULE = "example schedule now"


def shown_text(records: Sequence[StepRecord], window: int = WINDOW) -> str:
    """`SHOWN`: "64% of the messages of the games trained on (the schedule gave those games 62%)", over the last
    `window` steps that recorded the share (fewer at first: "first 2 steps"); "—" before any."""
    steps = [r for r in records if r.examples_shown is not None][-window:]
    if not steps:
        return "—"
    shown = sum(r.examples_shown or 0.0 for r in steps) / len(steps)
    text = f"{100 * shown:.0f}% of the messages of the games trained on"
    if len(steps) < window:
        text += f" (first {len(steps)} step{'s' * (len(steps) != 1)})"
    given = [r.examples_scheduled for r in steps if r.examples_scheduled is not None]
    if len(given) == len(steps):  # older records do not say: no half comparison
        text += f"; the schedule gave those games {100 * sum(given) / len(given):.0f}%"
    return text


def schedule_text(schedule: ExampleSchedule, version: int) -> str:
    """`SCHEDULE`: "43% of messages in games started by v18 (fading: every message up to v0, none from v30)"."""
    return (
        f"{100 * schedule.probability(version):.0f}% of messages in games started by v{version} ({schedule.describe()})"
    )


def example_rows(status: TrainerStatus) -> list[tuple[str, str]]:
    """Both figures as (name, value), in the order the pages show them."""
    return [(SHOWN, shown_text(status.recent)), (SCHEDULE, schedule_text(status.examples, status.version))]
