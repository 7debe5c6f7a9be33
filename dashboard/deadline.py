"""The deadline by which a role's process ends once told to stop (SIGTERM or SIGINT), whatever its cleanup does.

Every wait of a role's cleanup is bounded (the server's grace, the trainer's step and flush, the rollout's threads
and engine), but a thread can hold what the cleanup needs past them: a lock held across a driver call, a library's
shutdown, a call into CUDA that does not return. On a GPU machine `bench.trainer run` once waited more than 45 s
for the roles it had stopped, with nothing in their logs to say where. The deadline is the backstop:
`settings.STOP_DEADLINE_S` after the first signal, faulthandler's own thread writes every thread's stack to stderr
(the role's log) and ends the process with status 1. That thread needs no interpreter lock, so a thread holding it
cannot stop the deadline. A clean stop ends long before it.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys
import time

import settings

logger = logging.getLogger(__name__)

_armed_at: float | None = None  # the process's one deadline (signals are the process's): when it was started


def arm(signum: int, seconds: float = settings.STOP_DEADLINE_S) -> bool:
    """Start the deadline at the first call; later calls change nothing. Safe in a signal handler (it starts the
    timer of a thread that already runs, and logs one line). Returns True if this call started it.

    Args:
        signum: The signal that asked the process to stop (named in the log).
        seconds: When the process ends, from now, if it has not by itself.
    """
    global _armed_at
    if _armed_at is not None:
        return False
    _armed_at = time.monotonic()
    faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
    logger.info(
        "%s: stopping (the process ends within %.0f s; past that, every thread's stack is written here and "
        "it exits with status 1)",
        signal.Signals(signum).name,
        seconds,
    )
    return True
