"""The step count the pages show beside the committed version: the two move together."""

from __future__ import annotations

from trainer_space.progress import StepCount


def test_a_version_shows_the_steps_it_holds_while_later_steps_upload_or_wait() -> None:
    count = StepCount(first=12)  # 12 steps before this process, read from the bucket's history
    assert (count.steps, count.at(7)) == (12, 12)  # resumed at version 7: nothing of this process committed yet
    assert count.step_done(8) == 13  # step 13 goes out as version 8, still uploading
    assert count.at(7) == 12  # the pages keep showing "version 7 · step 12", not "version 7 · step 13"
    count.step_done(9)
    count.step_done(9)  # uploads fell behind: steps 14 and 15 are folded into version 9
    assert (count.at(8), count.steps) == (13, 15)
    assert count.at(9) == 15
    count.step_done(10)  # step 16 ended, the run is paused before its version is committed
    assert count.at(9) == 15 and count.at(10) == 16  # once committed, version and step move together
