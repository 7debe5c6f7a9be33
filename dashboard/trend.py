"""Short texts about where training stands, for status lines and the landing page: a recent value with
its trend, and a step counter that does not pretend a run is nearly over (or barely begun).

Pure Python on plain numbers (no plotly): the launcher's landing page imports it without a UI stack.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Steps averaged at each end of a trend: one GRPO step is a few games, so one step alone is noise.
WINDOW = 5
#: A run whose end, at the current pace, is further away than this is shown as open-ended.
OPEN_ENDED_S = 2 * 3600.0


def trend_text(values: Sequence[float | None], percent: bool = False, window: int = WINDOW) -> str:
    """The mean of the last `window` values, and how it moved since the first `window` of `values`:
    "54% (up 21 pts over 20 steps)", "2.1 (down 0.3 over 12 steps)"; "—" without a value. None values
    (steps whose games were all dropped) are left out.
    """
    kept = [v for v in values if v is not None]
    if not kept:
        return "—"
    last = sum(kept[-window:]) / len(kept[-window:])
    shown = f"{100 * last:.0f}%" if percent else f"{last:.2f}"
    if len(kept) <= window:
        return f"{shown} ({'one step so far' if len(kept) == 1 else f'first {len(kept)} steps'})"
    first = sum(kept[:window]) / window
    change = (last - first) * (100 if percent else 1)
    size = f"{abs(change):.0f} pts" if percent else f"{abs(change):.2f}"
    if float(size.split()[0]) == 0:
        return f"{shown} (flat over {len(values)} steps)"
    return f"{shown} ({'up' if change > 0 else 'down'} {size} over {len(values)} steps)"


def step_text(step: int, max_steps: int, step_s: float | None) -> str:
    """ "step 21" for a run whose end is far away at the current pace (or unknown), "step 21 / 50" when
    the end is near enough to mean something: 21 of 1000 steps read as "2 % done" for a run that is
    stopped after 20 minutes."""
    if step_s is None or (max_steps - step) * step_s > OPEN_ENDED_S:
        return f"step {step}"
    return f"step {step} / {max_steps}"
