"""``python -m launcher._guard PARENT_PID COMMAND...``: exec COMMAND, SIGTERMed if the launcher dies.

Linux's PR_SET_PDEATHSIG survives exec, so the app itself receives SIGTERM when the launcher that
spawned it goes away, even when the launcher is SIGKILLed and cannot clean up. Elsewhere it just execs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    """Arm the parent-death signal, make sure the parent is still there, exec the command."""
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:  # the launcher died before the signal was armed
            raise SystemExit(1)
    os.execv(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
