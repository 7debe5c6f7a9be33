"""The rollout server's choices as a table: each row is what a server knows at one look (`Known`) and what it does
(`Choice`). The producer and the examiner only carry these answers out (tests/test_rollout_producer.py,
test_rollout_exam.py run them against a real engine, env and bucket)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from rollout_space.choices import EXAM_RETRY_S, FIRST_STEP_WAIT_S, Choice, Exam, Known, Look, choose
from wire.fleet import RunState, ServerState

NOW = 10_000.0
#: A running run with exams, room in the bucket, this server's first batch handed in a minute ago, version 3 held
#: and published.
RUN = Known(RunState.RUNNING, now=NOW, pending=0, max_pending=4, first_batch_at=NOW - 60, held=3, published=3,
            exams=True, max_staleness=2)
#: The trainer's first step not published yet: version 0 held, nothing published.
V0 = replace(RUN, held=0, published=None)
#: Version 0 kept for its exam.
KEPT = replace(V0, kept=True)
#: Sharing the trainer's cores; its first batch, taken by the trainer, handed in 5 s ago.
ALONE = replace(V0, first_step_alone=True, first_batch_at=NOW - 5)
FULL = replace(RUN, pending=4)

PRODUCING, WAITING, FULL_, PAUSED, NO_RUN = (ServerState.PRODUCING, ServerState.WAITING, ServerState.FULL,
                                             ServerState.PAUSED, ServerState.NO_RUN)

ROWS = [
    # no run, or a run paused or stopped: nothing played, no exam, a kept version let go
    ("no run", Known(None), Choice(NO_RUN)),
    ("no run, v0 kept", Known(None, kept=True), Choice(NO_RUN, Exam.LET_GO)),
    ("paused", replace(RUN, run=RunState.PAUSED), Choice(PAUSED)),
    ("stopped, v0 kept", replace(KEPT, run=RunState.STOPPED), Choice(PAUSED, Exam.LET_GO)),
    # producing: the exam before the batch, on the examiner, after the first batch
    ("before the first batch", replace(RUN, first_batch_at=None), Choice(PRODUCING)),
    ("who examines?", RUN, Choice(PRODUCING, look=Look.PEERS)),
    ("another server examines", replace(RUN, examines=False), Choice(PRODUCING)),
    ("examines: is one due?", replace(RUN, examines=True), Choice(PRODUCING, look=Look.EXAMS)),
    ("none due", replace(RUN, examines=True, due=False), Choice(PRODUCING)),
    ("due", replace(RUN, examines=True, due=True), Choice(PRODUCING, Exam.TAKE)),
    ("no exams in the run: no heartbeats read", replace(RUN, exams=False), Choice(PRODUCING)),
    ("an exam failed a while ago", replace(RUN, exam_failed_at=NOW - EXAM_RETRY_S + 1), Choice(PRODUCING)),
    ("an exam failed long ago", replace(RUN, examines=True, exam_failed_at=NOW - EXAM_RETRY_S - 1),
     Choice(PRODUCING, look=Look.EXAMS)),
    # full: back-pressure; a look for an exam once per version held or published
    ("full, first look", FULL, Choice(FULL_, look=Look.PEERS)),
    ("full, due", replace(FULL, examines=True, due=True), Choice(FULL_, Exam.TAKE)),
    ("full, looked at this version", replace(FULL, full_at=(3, 3)), Choice(FULL_)),
    ("full, a new version held", replace(FULL, full_at=(2, 3)), Choice(FULL_, look=Look.PEERS)),
    ("full, more than full", replace(FULL, pending=9), Choice(FULL_, look=Look.PEERS)),
    # version 0: its exam waits for the trainer's first step, version 0 kept meanwhile
    ("v0 due, nothing published", replace(V0, examines=True, due=True), Choice(PRODUCING, Exam.KEEP)),
    ("v0 due, no stale game allowed", replace(V0, max_staleness=0, examines=True, due=True),
     Choice(PRODUCING, Exam.TAKE)),
    ("v0 due, step 1 published", replace(V0, published=1, examines=True, due=True), Choice(PRODUCING, Exam.TAKE)),
    ("v0 kept, who examines?", KEPT, Choice(PRODUCING, look=Look.PEERS)),
    ("v0 kept, still examines: kept, no records read", replace(KEPT, examines=True), Choice(PRODUCING, Exam.KEEP)),
    ("v0 kept, step 1 published: is it due?", replace(KEPT, published=1, examines=True),
     Choice(PRODUCING, look=Look.EXAMS)),
    ("v0 kept, step 1 published", replace(KEPT, published=1, examines=True, due=True),
     Choice(PRODUCING, Exam.TAKE)),
    ("v0 kept, step 1 published, v0 examined", replace(KEPT, published=1, examines=True, due=False),
     Choice(PRODUCING, Exam.LET_GO)),
    ("v0 kept, the run allows no stale game now", replace(KEPT, max_staleness=0, examines=True),
     Choice(PRODUCING, look=Look.EXAMS)),
    # the hand-off (issue 56): a server with a lower id joined, and examines: the kept version is let go
    ("v0 kept, another server examines", replace(KEPT, examines=False), Choice(PRODUCING, Exam.LET_GO)),
    ("v0 kept, full, another server examines", replace(KEPT, pending=4, full_at=(0, None), examines=False),
     Choice(FULL_, Exam.LET_GO)),
    ("v0 kept, waiting for step 1, another server examines", replace(KEPT, first_step_alone=True, examines=False),
     Choice(WAITING, Exam.LET_GO)),
    ("v0 kept, the run's exams off", replace(KEPT, exams=False), Choice(PRODUCING, Exam.LET_GO)),
    ("v0 kept, its exam failed", replace(KEPT, exam_failed_at=NOW), Choice(PRODUCING, Exam.LET_GO)),
    ("v0 kept, a new run", replace(KEPT, first_batch_at=None), Choice(PRODUCING, Exam.LET_GO)),
    # full and kept: who examines is read at every look (not once per version), so a hand-off is seen within a poll
    ("v0 kept, full, looked at v0", replace(KEPT, pending=4, full_at=(0, None)), Choice(FULL_, look=Look.PEERS)),
    ("v0 kept, full, still examines", replace(KEPT, pending=4, full_at=(0, None), examines=True),
     Choice(FULL_, Exam.KEEP)),
    ("v0 kept, full, step 1 published, due", replace(KEPT, pending=4, full_at=(0, None), published=1,
                                                     examines=True, due=True), Choice(FULL_, Exam.TAKE)),
    # the first step trains alone on the cores this server shares (`--first-step-alone`)
    ("first step trains alone", ALONE, Choice(WAITING, look=Look.PEERS)),
    ("first step trains alone, v0 due", replace(ALONE, examines=True, due=True), Choice(WAITING, Exam.KEEP)),
    ("first step alone, before the first batch", replace(ALONE, first_batch_at=None), Choice(PRODUCING)),
    ("first step alone, groups left for the step", replace(ALONE, pending=1), Choice(PRODUCING, look=Look.PEERS)),
    ("first step alone, step 1 published", replace(ALONE, published=1), Choice(PRODUCING, look=Look.PEERS)),
    ("first step alone, waited too long", replace(ALONE, first_batch_at=NOW - FIRST_STEP_WAIT_S),
     Choice(PRODUCING, look=Look.PEERS)),
    ("first step alone, full", replace(ALONE, pending=4), Choice(FULL_, look=Look.PEERS)),
    ("not sharing the cores", replace(ALONE, first_step_alone=False), Choice(PRODUCING, look=Look.PEERS)),
]


@pytest.mark.parametrize(("known", "choice"), [pytest.param(k, c, id=name) for name, k, c in ROWS])
def test_what_a_server_does_given_what_it_knows(known: Known, choice: Choice) -> None:
    assert choose(known) == choice


def every_known() -> list[Known]:
    """What a server can know, over every value each choice turns on."""
    fields = dict(run=[None, RunState.RUNNING, RunState.PAUSED], pending=[0, 1, 4], first_batch_at=[None, NOW - 5],
                  first_step_alone=[False, True], held=[0, 3], published=[None, 1], exams=[False, True],
                  max_staleness=[0, 2], kept=[False, True], exam_failed_at=[None, NOW],
                  full_at=[None, (0, None), (3, 1)], examines=[None, False, True], due=[None, False, True])
    every = (Known(now=NOW, max_pending=4, **dict(zip(fields, values)))
             for values in itertools.product(*fields.values()))
    return [k for k in every if not k.kept or k.held == 0]  # only version 0 is ever kept


def test_a_look_answered_is_never_asked_again_and_asks_nothing_else_until_then() -> None:
    """Each look answers one question, so the producer's read-and-choose-again ends; meanwhile nothing is done."""
    for known in every_known():
        choice = choose(known)
        if choice.look is None:
            continue
        assert choice.exam == Exam.NONE, known
        answered = replace(known, **{"examines" if choice.look == Look.PEERS else "due": True})
        assert choose(answered).look != choice.look and choose(answered).state == choice.state, known


def test_what_is_kept_and_taken_follows_from_what_is_known() -> None:
    for known in every_known():
        choice = choose(known)
        assert choice.state in (PRODUCING, WAITING, FULL_) or (choice.exam in (Exam.NONE, Exam.LET_GO, Exam.KEEP)
                                                              and choice.look is None), known
        assert known.kept or choice.exam != Exam.LET_GO, known  # only what is kept is let go
        if choice.exam == Exam.TAKE:
            assert known.examines and known.due and known.first_batch_at is not None, known
        if choice.exam == Exam.KEEP and not known.kept:  # kept from now on: the exam of version 0 waits
            assert known.examines and known.due and known.held == 0 and (known.published or 0) < 1, known
