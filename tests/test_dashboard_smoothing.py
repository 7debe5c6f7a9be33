"""dashboard.smoothing: the EMA behind the smoothed learning curves."""

from __future__ import annotations

import pytest

from dashboard.smoothing import ema


def test_ema_starts_at_the_first_value_and_skips_gaps() -> None:
    assert ema([]) == []
    assert ema([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])  # debiased: no pull towards 0
    assert ema([0.0, 1.0], weight=0.5) == pytest.approx([0.0, 0.5 / 0.75])
    smoothed = ema([1.0, None, 0.0], weight=0.5)
    assert smoothed[1] is None and smoothed[2] == pytest.approx(0.25 / 0.75)  # a gap does not move it
    assert ema([3.0, 5.0], weight=0.0) == [3.0, 5.0]  # weight 0: the raw values


def test_ema_refuses_a_weight_outside_0_1() -> None:
    with pytest.raises(ValueError, match=r"weight must be in \[0, 1\), got 1.0"):
        ema([1.0], weight=1.0)
