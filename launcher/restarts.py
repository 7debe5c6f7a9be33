"""What the launcher does when one of its apps exits on its own while the others run.

A rollout server is one member of a fleet the trainer takes games from through the bucket: when it dies
(killed, out of memory, a crash), the trainer and the other servers go on, and the launcher starts it
again after a wait that doubles each time, a bounded number of times within a window (`RestartPolicy`).
Past that bound the server is left out and the fleet goes on one smaller; when no rollout server is left,
nothing can train and the launcher stops everything. The env and the trainer have no stand-in: one of
them exiting stops everything, with the end of its log (`ChildFailed`).

`Supervisor.tick` does all of it from the launcher's main loop, once a second, in the main thread (a child
must be started from the thread that lives as long as the launcher: its parent-death signal follows that
thread). Each child's `state` says where it stands, for the landing page.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .children import Child, ChildFailed, Ended, exit_text


@dataclass(frozen=True)
class RestartPolicy:
    """How often a rollout server that died is started again.

    Args:
        max_restarts: Restarts of one server within `window_s`; past them it is left out of the fleet.
        window_s: Seconds over which restarts count (a server that ran longer than this since its last restart
            starts counting afresh).
        first_wait_s: Seconds before the first restart; each later one within the window waits twice as long.
        max_wait_s: The longest wait.
    """

    max_restarts: int = 3
    window_s: float = 600.0
    first_wait_s: float = 5.0
    max_wait_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0 or self.window_s <= 0 or not 0 <= self.first_wait_s <= self.max_wait_s:
            raise ValueError(
                f"invalid restart policy {self}: max_restarts >= 0, window_s > 0 and 0 <= first_wait_s <= max_wait_s"
            )

    def wait_s(self, restart: int) -> float:
        """Seconds before restart number `restart` (1 for the first)."""
        return min(self.max_wait_s, self.first_wait_s * 2 ** (restart - 1))


@dataclass
class _Restarts:
    """One rollout server's restarts: when each happened, and when the next is due (None: none due)."""

    times: list[float] = field(default_factory=list)
    due: float | None = None
    given_up: bool = False
    last_exit: str = ""


class Supervisor:
    """Watches the launcher's apps; restarts rollout servers that die (see the module docstring).

    Args:
        children: The apps, all started.
        policy: How rollout servers are restarted.
        ready_timeout_s: Seconds a restarted server may take to answer its health check.
        say: Prints one line of the launcher's output.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        children: Sequence[Child],
        policy: RestartPolicy,
        ready_timeout_s: float,
        say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = list(children)
        self.policy = policy
        self.ready_timeout_s = ready_timeout_s
        self.say = say
        self.clock = clock
        self._restarts = {c.name: _Restarts() for c in self.children if c.role == "rollout"}
        self._started_at: dict[str, float] = {}  # restarted and not yet healthy: when it was started

    def restarts(self, name: str) -> int:
        """How many times the rollout server `name` was restarted (0 for the other apps)."""
        record = self._restarts.get(name)
        return len(record.times) if record else 0

    def last_exit(self, name: str) -> str:
        """How the rollout server `name` last ended on its own, in words ("" if it never did)."""
        record = self._restarts.get(name)
        return record.last_exit if record else ""

    def tick(self) -> None:
        """Look at every app once: restart what is due, notice what came back or died.

        Raises:
            ChildFailed: the env or the trainer exited, or the last rollout server was given up.
        """
        now = self.clock()
        for child in self.children:
            record = self._restarts.get(child.name)
            if record is not None and record.due is not None:
                if now >= record.due:
                    record.due = None
                    record.times.append(now)
                    self._started_at[child.name] = now
                    child.start()
                    child.state = f"restarting (restart {len(record.times)} of at most {self.policy.max_restarts})"
                continue
            if record is not None and record.given_up:
                continue
            code = child.returncode()
            if code is not None:
                self._exited(child, child.exited(), now)
            elif child.name in self._started_at:
                self._check_restarted(child, now)

    def _check_restarted(self, child: Child, now: float) -> None:
        if child.healthy():
            del self._started_at[child.name]
            child.state = "ready"
            self.say(f"{child.name} is back (restart {self.restarts(child.name)}); it rejoins the fleet")
        elif now - self._started_at[child.name] > self.ready_timeout_s:
            child.stop(10.0)
            self._exited(child, Ended(1), now, f"was not ready {self.ready_timeout_s:.0f} s after its restart")

    def _exited(self, child: Child, ended: Ended, now: float, why: str | None = None) -> None:
        self._started_at.pop(child.name, None)
        what = why or exit_text(ended)
        if child.role != "rollout":
            child.state = f"exited: {what}"
            raise ChildFailed(child.name, what, child.log_tail())
        record = self._restarts[child.name]
        record.last_exit = what
        recent = [t for t in record.times if now - t <= self.policy.window_s]
        if len(recent) >= self.policy.max_restarts:
            record.given_up = True
            child.state = (
                f"left out of the fleet: {what}, after {len(recent)} restart"
                f"{'s' * (len(recent) != 1)} within {self.policy.window_s / 60:.0f} min"
            )
            self.say(
                f"{child.name} {what}; it was restarted {len(recent)} times within "
                f"{self.policy.window_s / 60:.0f} min, so it stays stopped and the fleet goes on without it. "
                f"The end of its log:\n{child.log_tail()}"
            )
            if all(self._restarts[c.name].given_up for c in self.children if c.role == "rollout"):
                raise ChildFailed(
                    child.name, f"{what}, and no rollout server is left to play the trainer's games", child.log_tail()
                )
            return
        wait = self.policy.wait_s(len(recent) + 1)
        record.times = recent
        record.due = now + wait
        child.state = f"exited ({what}); restarting in {wait:.0f} s"
        self.say(
            f"{child.name} {what}; the trainer and the other apps go on, and it restarts in {wait:.0f} s "
            f"(restart {len(recent) + 1} of at most {self.policy.max_restarts} within "
            f"{self.policy.window_s / 60:.0f} min). The end of its log:\n{child.log_tail(12)}"
        )
