"""``python app.py`` (the all-in-one launcher) as the tests start it: a tiny model, free ports, a temp bucket.

Used by test_app_launcher.py and test_product_browser.py.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests._env_server import REPO, free_port
from tests._trainer_stack import FAST_TRAINING

READY_LINE = "all apps are ready"


@dataclass
class Launch:
    """One running ``python app.py all``: its process, ports and output file."""

    proc: subprocess.Popen[bytes]
    out: Path
    ports: dict[str, int]

    def url(self, app: str) -> str:
        """Base URL of ``landing``, ``env``, ``rollout`` or ``trainer``."""
        return f"http://127.0.0.1:{self.ports[app]}"

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_ready(self, timeout_s: float) -> None:
        """Until the launcher prints that all apps are ready (AssertionError with its output if not)."""
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.output():
            assert self.proc.poll() is None, f"the launcher exited {self.proc.returncode}:\n{self.output()}"
            assert time.monotonic() < deadline, f"not ready after {timeout_s} s:\n{self.output()}"
            time.sleep(0.5)

    def status(self, app: str) -> dict:
        return httpx.get(f"{self.url(app)}/status", timeout=5).json()

    def app_pids(self) -> set[int]:
        """Every process in the three apps' process groups (the launcher starts each as a group leader)."""
        leaders = {pid for pid, (ppid, _) in _processes().items() if ppid == self.proc.pid}
        return {pid for pid, (_, pgid) in _processes().items() if pgid in leaders}

    def app_pid(self, name: str) -> int:
        """The process id of one app (`env`, `trainer`, `rollout`, `rollout-2`...): the launcher's child whose
        command names it."""
        for pid, (ppid, _) in _processes().items():
            if ppid != self.proc.pid:
                continue
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "--server-id" in argv:  # a rollout server: named by its id
                if argv[argv.index("--server-id") + 1] == name:
                    return pid
            elif "app.py" in argv and argv[argv.index("app.py") + 1] == name:
                return pid
        raise AssertionError(f"no app {name!r} among the launcher's children")

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout_s: float = 120) -> int:
        """Send `sig` to the launcher (Ctrl-C is SIGINT); its exit status once it has exited."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the launcher did not exit {timeout_s} s after {sig.name}:\n{self.output()}")

    def kill(self) -> None:
        """Last resort cleanup: SIGKILL the launcher and every process of its apps."""
        pids = self.app_pids()
        self.proc.kill()
        self.proc.wait()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _processes() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, process group id) of every process, from /proc."""
    table: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state ppid pgrp ...
        table[int(entry)] = (int(fields[1]), int(fields[2]))
    return table


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (zombies, dead but not yet reaped by their new parent, do not count)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def start_launcher(model: str, bucket: Path, logs: Path, out: Path, *extra: str) -> Launch:
    """Start ``python app.py all`` on free ports with the tests' fast training settings, its kept tokens beside
    `logs` (so a second start with the same `logs` finds them). Returns at once."""
    ports = {app: free_port() for app in ("landing", "env", "rollout", "trainer")}
    env = {k: v for k, v in os.environ.items() if k not in ("SPACE_ROLE", "SPACE_ID", "DELTA_BUCKET", "MODEL")}
    args = [sys.executable, "app.py", "all", "--model", model, "--bucket", str(bucket), "--logs", str(logs),
            "--keys", str(logs.parent / "keys"),
            "--port", str(ports["landing"]), "--env-port", str(ports["env"]),
            "--rollout-port", str(ports["rollout"]), "--trainer-port", str(ports["trainer"]),
            "--engine", "transformers", "--ready-timeout", "240", "--stop-timeout", "20",
            "--trainer-args", shlex.join(FAST_TRAINING), *extra]
    with open(out, "wb") as f:
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    return Launch(proc, out, ports)
