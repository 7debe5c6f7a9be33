from dashboard.trend import step_text, trend_text


def test_trend_compares_the_last_steps_with_the_first() -> None:
    assert trend_text([]) == "—" and trend_text([None, None]) == "—"
    assert trend_text([0.2, 0.4], percent=True) == "30% (first 2 steps)"
    assert trend_text([0.25], percent=True) == "25% (one step so far)"
    rates = [0.2] * 5 + [None] + [0.5] * 4 + [0.7]  # a step with every game dropped is left out
    assert trend_text(rates, percent=True) == "54% (up 34 pts over 11 steps)"
    assert trend_text([3.0] * 6 + [2.5] * 5) == "2.50 (down 0.50 over 11 steps)"
    assert trend_text([1.0] * 12) == "1.00 (flat over 12 steps)"


def test_step_counter_is_open_ended_unless_the_end_is_near() -> None:
    assert step_text(0, 1000, None) == "step 0"
    assert step_text(21, 1000, 57.0) == "step 21"  # 15 hours to go: the run is stopped long before
    assert step_text(21, 50, 57.0) == "step 21 / 50"
    assert step_text(900, 1000, 1.2) == "step 900 / 1000"

