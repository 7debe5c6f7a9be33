"""What a rollout server does at each look at the run, as one pure function (`choose`) of what it knows (`Known`) to
what it does (`Choice`): produce, wait while the trainer's first step trains alone, stay full, stay paused; and about
the exam: take it, keep version 0 for it, let a kept version 0 go, or nothing.

`producer.GroupProducer.step` gathers what the server knows, reads what an answer asks for first (`Choice.look`: the
heartbeats, the exam records: bucket listings, read only where the answer turns on them) and asks again, then
carries the answer out, with `exam.Examiner` for the exam. The rows are tests/test_rollout_choices.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from wire.fleet import RunState, ServerState

#: Most seconds a server started with `first_step_alone` waits for the trainer's first step after its first batch: far
#: longer than that step takes on 2 CPU cores (docs/benchmarks.md), so that a trainer that refused the batch and waits
#: for more groups gets them all the same.
FIRST_STEP_WAIT_S = 120.0
#: Seconds before an exam that failed (or whose records could not be read) is tried again; training games go on.
EXAM_RETRY_S = 60.0


class Exam(StrEnum):
    """What the server does about the exam at one look."""

    NONE = "none"
    """Nothing: no exam now, and no version kept for one."""
    TAKE = "take"
    """Take the exam due, of the version held, now; a version kept for it is let go after it."""
    KEEP = "keep"
    """Keep version 0 loaded (from now, or still) for its exam, which waits for the trainer's first step."""
    LET_GO = "let go"
    """Let go of version 0, kept for an exam this server will not take: it follows the bucket again."""


class Look(StrEnum):
    """What the server reads before it can choose: each is a bucket listing."""

    PEERS = "peers"
    """The heartbeats, now: is this server the run's examiner? (Read at that moment, not a beat ago: two servers
    that started together must not both examine.)"""
    EXAMS = "exams"
    """The exam records: is an exam due for the version held?"""


@dataclass(frozen=True)
class Known:
    """What a rollout server knows at one look at the run. Times are `time.monotonic()` seconds."""

    run: RunState | None
    """The run's state; None: no run this server trusts (none written yet, or one signed with another key)."""
    now: float = 0.0
    pending: int = 0
    """The run's groups waiting in the bucket (counted only while the run runs)."""
    max_pending: int = 1
    """The run's back-pressure bound (`RunSettings.max_pending_groups`): full at that many pending."""
    first_batch_at: float | None = None
    """When this server handed in its first batch for the run; None: not yet (no exam before it: the trainer's first
    step waits on groups, not on the exam of version 0)."""
    first_step_alone: bool = False
    """The server shares the trainer's cores (`GroupProducer.first_step_alone`)."""
    held: int = 0
    """The version served."""
    published: int | None = None
    """The newest version the bucket has published (None: none, or unknown)."""
    exams: bool = False
    """The run asks for exams (`RunSettings.exam`) and this server can play them (it has an env)."""
    max_staleness: int = 0
    """The run's staleness bound: at 0 every batch must play the newest version, so version 0 is never kept."""
    kept: bool = False
    """Version 0 is kept for its exam (`exam.Examiner.kept`)."""
    exam_failed_at: float | None = None
    """When an exam for the run, or reading the records for one, last failed (None: never)."""
    full_at: tuple[int, int | None] | None = None
    """(held, published) when this server last chose while full in this run: while full, it looks for an exam
    once per version held or published, not at every poll."""
    examines: bool | None = None
    """This server is the run's examiner, from the heartbeats read for this look (`Look.PEERS`); None: not read."""
    due: bool | None = None
    """An exam is due for `held`, from the records read for this look (`Look.EXAMS`); None: not read."""


@dataclass(frozen=True)
class Choice:
    """What the server does at one look."""

    state: ServerState
    """What it does, as its heartbeat says: PRODUCING plays a batch (after the exam); the others wait a poll."""
    exam: Exam = Exam.NONE
    """What it does about the exam (before the batch)."""
    look: Look | None = None
    """Read this and choose again with it known; `exam` is NONE until then."""


def choose(known: Known) -> Choice:
    """What a rollout server does, given what it knows: the state from the run, the room and the first step; the exam
    from who examines, what is due and what is kept (see `Exam`, `Look`, and the rows in
    tests/test_rollout_choices.py)."""
    state = _state(known)
    exam, look = _exam(known, state)
    return Choice(state, exam, look)


def _state(k: Known) -> ServerState:
    """Paused or stopped, full (back-pressure: more groups would only go stale), waiting while the first step trains
    alone on the cores this server shares, or producing."""
    if k.run is None:
        return ServerState.NO_RUN
    if k.run != RunState.RUNNING:
        return ServerState.PAUSED
    if k.pending >= k.max_pending:
        return ServerState.FULL
    if _first_step_trains_alone(k):
        return ServerState.WAITING
    return ServerState.PRODUCING


def _first_step_trains_alone(k: Known) -> bool:
    """Whether the trainer's first step trains alone now (`first_step_alone`): this server handed in its first batch
    for the run, the trainer took every group (with groups left it waits for more, which are played) and has not
    published yet, within `FIRST_STEP_WAIT_S` of that batch."""
    return (
        k.first_step_alone
        and k.first_batch_at is not None
        and k.pending == 0
        and (k.published or 0) < 1
        and k.now - k.first_batch_at < FIRST_STEP_WAIT_S
    )


def _exam(k: Known, state: ServerState) -> tuple[Exam, Look | None]:
    """The exam's part of the choice, and what to read first. Version 0 is kept only while this server will take its
    exam: on anything else (no run, the run paused or stopped, a new run, no exams, a failed exam, another server
    examining, no exam due) it is let go, and the server follows the bucket again."""
    idle = Exam.LET_GO if k.kept else Exam.NONE
    retrying = k.exam_failed_at is not None and k.now - k.exam_failed_at < EXAM_RETRY_S
    if state in (ServerState.NO_RUN, ServerState.PAUSED) or k.first_batch_at is None or not k.exams or retrying:
        return idle, None
    if state == ServerState.FULL and not k.kept and k.full_at == (k.held, k.published):
        return Exam.NONE, None  # looked at this version while full already: no bucket listings at every poll
    if k.examines is None:
        return Exam.NONE, Look.PEERS  # while v0 is kept, at every look: a hand-off is seen within a poll
    if not k.examines:
        return idle, None
    v0_waits = k.held == 0 and k.max_staleness >= 1 and (k.published or 0) < 1
    if k.kept and v0_waits:
        return Exam.KEEP, None  # still due (kept because it was, and only the examiner writes exams): nothing to read
    if k.due is None:
        return Exam.NONE, Look.EXAMS
    if not k.due:
        return idle, None
    if v0_waits:
        return Exam.KEEP, None  # played now, the exam of version 0 would slow the trainer's first step by half
    return Exam.TAKE, None
