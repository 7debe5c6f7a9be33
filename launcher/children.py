"""One app as a child process: started in its own process group, health-checked, stopped with bounded waits.

Each child runs ``python -m launcher._guard PARENT_PID python app.py ROLE ...``: the guard asks the
kernel to SIGTERM it if the launcher dies (even by SIGKILL), then execs the app. Stopping sends
SIGTERM to the child's whole process group (the app and anything it spawned: vLLM's engine process),
waits, then SIGKILLs the group, so nothing outlives the launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

from .config import REPO

#: Variables the launcher sets by flags instead; a Space's SPACE_ROLE would also redirect app.py.
_DROPPED_VARIABLES = ("SPACE_ROLE", "GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT")


class ChildFailed(RuntimeError):
    """An app exited, or did not get ready in time. Carries the role and the end of its log."""

    def __init__(self, role: str, reason: str, log_tail: str) -> None:
        super().__init__(f"the {role} app {reason}; the end of its log:\n{log_tail}")
        self.role = role
        self.reason = reason
        self.log_tail = log_tail


@dataclass
class Child:
    """One app of the all-in-one launch.

    Args:
        role: ``env``, ``rollout`` or ``trainer``.
        name: What to call it (its log, its card): the role, or ``rollout-2`` for a second rollout server.
        host / port: Where it listens (loopback by default).
        args: Its flags besides --host/--port.
        log_path: File its stdout and stderr are appended to.
        environ: Variables set for it on top of the launcher's own (secrets such as OWNER_TOKEN).
    """

    role: str
    host: str
    port: int
    args: list[str]
    log_path: str
    environ: dict[str, str] = field(default_factory=dict, repr=False)
    name: str = ""
    state: str = "waiting"
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _asked_at: float | None = field(default=None, repr=False)  # when `terminate` sent SIGTERM
    _ended_at: float | None = field(default=None, repr=False)  # when it was first seen ended after that

    def __post_init__(self) -> None:
        self.name = self.name or self.role

    @property
    def url(self) -> str:
        """Base URL to reach it (loopback when it listens on every interface)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """Its process id (also its process group id), None before start."""
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Start it in a new session (its own process group); again after it exited, to restart it. Returns at
        once. Call from the main thread: the parent-death signal follows the thread that started the child."""
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in _DROPPED_VARIABLES}
        env.update(self.environ, PYTHONUNBUFFERED="1")
        command = [
            sys.executable,
            "-m",
            "launcher._guard",
            str(os.getpid()),
            sys.executable,
            "app.py",
            self.role,
            *self.args,
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command[4:])}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                command,
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._asked_at = self._ended_at = None
        self.state = "starting"

    def returncode(self) -> int | None:
        """Its exit status, None while it runs (or before start)."""
        return self._proc.poll() if self._proc else None

    def healthy(self) -> bool:
        """Whether ``GET /health`` answers 200 now."""
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout_s: float, stop: threading.Event) -> bool:
        """Block until it is healthy (True) or `stop` is set (False).

        Raises:
            ChildFailed: it exited, or was not healthy within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while not stop.is_set():
            code = self.returncode()
            if code is not None:
                self.state = f"exited ({code})"
                raise ChildFailed(self.name, f"exited with status {code} while starting", self.log_tail())
            if self.healthy():
                self.state = "ready"
                return True
            if time.monotonic() > deadline:
                raise ChildFailed(
                    self.name, f"was not ready after {timeout_s:.0f} s (--ready-timeout)", self.log_tail()
                )
            stop.wait(0.5)
        return False

    def terminate(self) -> None:
        """Ask it to stop: SIGTERM its process group, if it runs (`wait_stopped` then waits). Returns at once."""
        with self._lock:
            if self._proc is None or self._proc.poll() is not None or self._asked_at is not None:
                return
            self.state = "stopping"
            self._asked_at = time.monotonic()
            self._signal_group(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> Ended | None:
        """After `terminate`: wait up to `timeout_s` seconds since it was asked, then SIGKILL the group; then
        whatever it spawned into its group goes too. Idempotent. None if it was never started."""
        with self._lock:
            if self._proc is None:
                return None
            forced = False
            if self._proc.poll() is None:
                left = timeout_s - (time.monotonic() - (self._asked_at or time.monotonic()))
                try:
                    self._proc.wait(timeout=max(0.0, left))
                except subprocess.TimeoutExpired:
                    self._signal_group(signal.SIGKILL)
                    self._proc.wait(timeout=10)
                    forced = True
            return self._ended(forced)

    def poll_stopped(self) -> Ended | None:
        """After `terminate`: how it ended if it has (its group's leftovers are then killed), None while it runs.
        Never waits: the launcher polls every app it stopped, so each one's time is its own."""
        with self._lock:
            if self._proc is None or self._proc.poll() is None:
                return None
            return self._ended(False)

    def _ended(self, forced: bool) -> Ended:
        assert self._proc is not None and self._proc.returncode is not None
        if self._ended_at is None:
            self._ended_at = time.monotonic()
        self._signal_group(signal.SIGKILL)  # the app is gone; whatever it spawned into its group goes with it
        self.state = "stopped"
        took = None if self._asked_at is None else self._ended_at - self._asked_at
        return Ended(self._proc.returncode, forced, took)

    def stop(self, timeout_s: float) -> Ended | None:
        """`terminate`, then `wait_stopped`: SIGTERM, up to `timeout_s` seconds, then SIGKILL. Idempotent."""
        self.terminate()
        return self.wait_stopped(timeout_s)

    def exited(self) -> Ended:
        """How it ended, once `returncode` is not None, when nobody asked it to stop (it crashed, was killed)."""
        code = self.returncode()
        assert code is not None, "exited() is for an app that has exited"
        return Ended(code, False, None)

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        """The last `lines` lines of its log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 64_000))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"(no log at {self.log_path}: {e})"
        return "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Ended:
    """How an app's process ended.

    Attributes:
        code: Its exit status; negative: ended by that signal.
        forced: The launcher killed it (SIGKILL) because it did not stop within the stop timeout.
        seconds: From the launcher's SIGTERM to its end; None when the launcher did not ask it to stop.
    """

    code: int
    forced: bool = False
    seconds: float | None = None


def stop_all(
    children: Sequence[Child], timeout_s: float, say: Callable[[str], None], by: str = "the launcher"
) -> dict[str, Ended | None]:
    """SIGTERM every running app at once, the last one first (the trainer: it commits its last version), then watch
    them all until each has exited or `timeout_s` has passed since the signal, when what is left is killed (SIGKILL
    to its process group): they stop side by side, the whole stop takes as long as the slowest, at most `timeout_s`
    and the kill's wait, and each one's time is its own. `say` is told how each ended (`exit_text`; `by` names who
    kills). Returns how each ended, by name (None: never started)."""
    running = [c for c in reversed(children) if c.pid is not None and c.returncode() is None]
    if running:
        say(f"stopping {', '.join(c.name for c in running)} (each gets up to {timeout_s:.0f} s)")
    for child in running:
        child.terminate()
    ended: dict[str, Ended | None] = {}
    deadline = time.monotonic() + timeout_s
    while running and time.monotonic() < deadline:
        for child in list(running):
            if (end := child.poll_stopped()) is not None:
                say(f"{child.name} {exit_text(end, by)}")
                ended[child.name] = end
                running.remove(child)
        time.sleep(0.1)
    for child in running:
        ended[child.name] = child.wait_stopped(timeout_s)
        say(f"{child.name} {exit_text(ended[child.name], by)}")
    for child in children:  # those that had exited before: whatever they spawned into their group goes too
        ended.setdefault(child.name, child.wait_stopped(timeout_s) if child.pid is not None else None)
    return ended


def exit_text(ended: Ended | None, by: str = "the launcher") -> str:
    """How an app ended, in words, telling apart a clean stop, a kill by the launcher (`by`) after its stop timeout,
    and a signal from elsewhere (the kernel's OOM killer, a person's `kill -9`): "stopped in 2.1 s (exit status 0)",
    "killed by the launcher: it did not stop within 30 s", "killed by signal 9 (SIGKILL), not by the launcher"."""
    if ended is None:
        return "never started"
    took = "" if ended.seconds is None else f" in {ended.seconds:.1f} s"
    if ended.forced:
        return f"killed by {by}: it did not stop{took.replace(' in ', ' within ')}"
    if ended.code == 0:
        return f"stopped{took} (exit status 0)"
    if ended.code == -signal.SIGTERM and ended.seconds is not None:  # asked before its own handler was set up
        return f"stopped{took} (by SIGTERM)"
    if ended.code < 0:
        name = signal.Signals(-ended.code).name if -ended.code in signal.valid_signals() else "unknown"
        return f"killed by signal {-ended.code} ({name}){f', not by {by}' if ended.seconds is None else took}"
    return f"exited with status {ended.code}{took}"
