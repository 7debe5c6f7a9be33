"""The examples' schedule: one rule, by the weight version, the same for every player of a run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from wire.curriculum import ExampleMode, ExampleSchedule


def test_fading_shows_every_example_then_fewer_then_the_floor() -> None:
    schedule = ExampleSchedule(mode=ExampleMode.FADING, start=4, end=14, floor=0.2)
    assert [schedule.probability(v) for v in (0, 4)] == [1.0, 1.0]
    assert schedule.probability(9) == pytest.approx(0.6)
    assert [schedule.probability(v) for v in (14, 1000)] == [0.2, 0.2]
    assert schedule.describe() == "fading: every message up to v4, 20 % of messages from v14"
    assert ExampleSchedule().describe() == "fading: every message up to v0, none from v30"


def test_fixed_and_off_ignore_the_version() -> None:
    fixed, off = ExampleSchedule(mode="fixed"), ExampleSchedule(mode="off")
    assert {fixed.probability(v) for v in (0, 50, 10**6)} == {1.0}
    assert {off.probability(v) for v in (0, 50, 10**6)} == {0.0}
    assert "every message" in fixed.describe() and "never" in off.describe()


@given(st.integers(0, 100), st.integers(0, 100), st.floats(0, 1), st.integers(0, 300))
def test_the_probability_never_rises_with_the_version(start: int, length: int, floor: float, version: int) -> None:
    schedule = ExampleSchedule(start=start, end=start + length, floor=floor)
    assert floor <= schedule.probability(version + 1) <= schedule.probability(version) <= 1.0


def test_a_schedule_that_ends_before_it_starts_or_leaves_the_unit_interval_is_refused() -> None:
    with pytest.raises(ValidationError, match="ends .version 3. before it starts .version 5."):
        ExampleSchedule(start=5, end=3)
    with pytest.raises(ValidationError):
        ExampleSchedule(floor=1.5)
    with pytest.raises(ValidationError):
        ExampleSchedule.model_validate({"mode": "sometimes"})
