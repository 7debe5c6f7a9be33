"""Smoothing of noisy per-step training numbers, so a trend reads at a glance.

GRPO steps are small samples (a few games each): a step's reward or win rate jumps around. The
curves show each step's value as a point and a smoothed line through them.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Weight of the past in :func:`ema` (TensorBoard's smoothing slider, at its usual 0.8 ~ 5 steps).
SMOOTHING = 0.8


def ema(values: Sequence[float | None], weight: float = SMOOTHING) -> list[float | None]:
    """Exponential moving average with TensorBoard's debiasing: the first point is the first value
    (not pulled towards 0), and each later one is ``weight * previous + (1 - weight) * value``
    renormalised. None (a step whose games were all dropped) stays None and does not move the average.

    Raises:
        ValueError: ``weight`` outside [0, 1).
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"weight must be in [0, 1), got {weight}")
    smoothed: list[float | None] = []
    last, seen = 0.0, 0
    for value in values:
        if value is None:
            smoothed.append(None)
            continue
        last, seen = weight * last + (1.0 - weight) * value, seen + 1
        smoothed.append(last / (1.0 - weight**seen))
    return smoothed
