"""The trainer's step count, and which step each version holds: what the pages show as "version V · step S".

Steps and versions move apart: a step's version is handed to the publisher at the step's end and committed
seconds later (or folded into the next one when uploads fall behind), and a step is logged after its end.
Pages that showed the committed version beside the count of logged steps read "version 9 · step 10" while
an upload ran and "version 8 · step 7" for a whole pause. `StepCount` pairs them: each step's end records
the version it will be committed as, and `at` answers the steps a committed version holds, so a version
and its step are shown together or not at all. The count goes on from the history a restarted trainer read.
"""

from __future__ import annotations

import threading
from collections import deque


class StepCount:
    """Optimizer steps taken, and the version each one is committed as. Thread-safe (the training thread adds,
    the HTTP and UI threads read).

    Args:
        first: Steps taken before this process (the last step of the history in the bucket).
    """

    def __init__(self, first: int = 0) -> None:
        self._steps = first
        self._ends: deque[tuple[int, int]] = deque()  # (version, steps): one per step end, oldest first
        self._held = first  # steps held by the newest version asked about in `at`
        self._lock = threading.Lock()

    @property
    def steps(self) -> int:
        """Steps taken (this process's and the ones before)."""
        return self._steps

    def step_done(self, version: int) -> int:
        """Count a step that ended with its weights handed to the publisher as `version`; returns its number."""
        with self._lock:
            self._steps += 1
            self._ends.append((version, self._steps))
            return self._steps

    def at(self, version: int) -> int:
        """The steps whose weights `version` holds: the last step recorded as that version or an earlier one (the
        count before this process while no step of it was committed). Ask with committed versions only, which
        never go down."""
        with self._lock:
            while self._ends and self._ends[0][0] <= version:
                self._held = self._ends.popleft()[1]
            return self._held
