"""A role whose cleanup does not end still exits by `settings.STOP_DEADLINE_S` after SIGTERM or SIGINT, with every
thread's stack in its log to say where it hung (`dashboard.deadline`).

A real `python app.py env`, whose cleanup is made to hang after its server has shut down (as a thread holding a
lock across a driver call would make it), in a child process on a loopback port.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import settings
from tests._env_server import REPO, free_port, wait_healthy

#: `python app.py env` whose server, once shut down, waits on an event nobody sets.
HANGING = textwrap.dedent("""
    import sys
    import threading

    import app
    from dashboard import serving

    served = serving.serve

    def serve_then_hang(*args, **options):
        served(*args, **options)
        threading.Event().wait()  # a cleanup that never ends

    serving.serve = serve_then_hang
    app.main(["env", "--port", sys.argv[1]])
""")


def test_a_cleanup_that_hangs_ends_at_the_deadline_with_the_stacks_in_the_log(tmp_path: Path) -> None:
    """SIGTERM and SIGINT, each to its own app, both at once (the deadline is waited out once)."""
    started = {}
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            port, out = free_port(), tmp_path / f"env-{sig.name}.out"
            with open(out, "wb") as f:
                started[sig] = (subprocess.Popen([sys.executable, "-c", HANGING, str(port)], cwd=REPO, stdout=f,
                                                 stderr=subprocess.STDOUT), port, out)
        for proc, port, out in started.values():
            wait_healthy(proc, f"http://127.0.0.1:{port}", out)
        for sig, (proc, _, _) in started.items():
            proc.send_signal(sig)
        codes = {sig: proc.wait(settings.STOP_WITHIN_S + 20) for sig, (proc, _, _) in started.items()}
    finally:
        for proc, _, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for sig, (_, _, out) in started.items():
        output = out.read_text(errors="replace")
        assert codes[sig] == 1, output  # the deadline's exit: nothing else ends the hung cleanup
        assert f"{sig.name}: stopping (the process ends within {settings.STOP_DEADLINE_S} s" in output
        # The main thread's stack names where the cleanup hung.
        assert f"Timeout (0:00:0{settings.STOP_DEADLINE_S})!" in output and "in serve_then_hang" in output, output
