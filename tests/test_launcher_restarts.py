"""What the launcher does when one of its apps exits on its own: a rollout server is restarted with a growing
wait, a bounded number of times, then left out; the env, the trainer or the last rollout server stop everything.

The decisions run on a clock the test moves and on stand-ins for the child processes (what `Supervisor` reads of
a `Child`); tests/test_app_launcher.py SIGKILLs a real rollout server under a real launcher.
"""

from __future__ import annotations

import signal

import pytest

from launcher.children import ChildFailed, Ended
from launcher.restarts import RestartPolicy, Supervisor


class StandIn:
    """The parts of `launcher.children.Child` the supervisor uses: a process that can die, start, get healthy."""

    def __init__(self, name: str, role: str) -> None:
        self.name, self.role, self.state = name, role, "ready"
        self.code: int | None = None
        self.starts = self.stops = 0
        self.answers = False

    def returncode(self) -> int | None:
        return self.code

    def exited(self) -> Ended:
        assert self.code is not None
        return Ended(self.code)

    def start(self) -> None:
        self.starts += 1
        self.code, self.answers, self.state = None, False, "starting"

    def healthy(self) -> bool:
        return self.answers

    def stop(self, timeout_s: float) -> Ended:
        self.stops += 1
        self.code = -signal.SIGKILL
        return Ended(self.code, True, timeout_s)

    def log_tail(self, lines: int = 30) -> str:
        return f"(the end of {self.name}'s log)"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def fleet() -> tuple[Supervisor, dict[str, StandIn], Clock, list[str]]:
    apps = {n: StandIn(n, r) for n, r in (("env", "env"), ("rollout", "rollout"), ("rollout-2", "rollout"),
                                          ("trainer", "trainer"))}
    clock, said = Clock(), []
    supervisor = Supervisor(list(apps.values()), RestartPolicy(), ready_timeout_s=300, say=said.append, clock=clock)
    return supervisor, apps, clock, said


def test_a_killed_rollout_server_restarts_after_a_growing_wait_and_rejoins(fleet) -> None:
    supervisor, apps, clock, said = fleet
    rollout = apps["rollout-2"]
    rollout.code = -signal.SIGKILL
    supervisor.tick()
    assert rollout.state == "exited (killed by signal 9 (SIGKILL), not by the launcher); restarting in 5 s"
    assert said[-1].startswith("rollout-2 killed by signal 9 (SIGKILL), not by the launcher; the trainer and the "
                               "other apps go on, and it restarts in 5 s (restart 1 of at most 3 within 10 min)")
    clock.now += 4
    supervisor.tick()
    assert rollout.starts == 0  # not yet
    clock.now += 1
    supervisor.tick()
    assert rollout.starts == 1 and rollout.state == "restarting (restart 1 of at most 3)"
    rollout.answers = True
    supervisor.tick()
    assert rollout.state == "ready" and said[-1] == "rollout-2 is back (restart 1); it rejoins the fleet"
    assert (supervisor.restarts("rollout-2"), supervisor.last_exit("rollout-2")) == (
        1, "killed by signal 9 (SIGKILL), not by the launcher")
    rollout.code = 1  # dies again: twice the wait
    supervisor.tick()
    assert rollout.state == "exited (exited with status 1); restarting in 10 s"
    assert all(apps[n].starts == 0 for n in ("env", "rollout", "trainer"))  # the others were left alone


def test_past_its_restarts_a_server_is_left_out_and_the_last_one_stops_everything(fleet) -> None:
    supervisor, apps, clock, said = fleet

    def crash_and_wait(app: StandIn) -> None:
        app.code = 1
        supervisor.tick()
        clock.now += 61  # past any wait
        supervisor.tick()

    for _ in range(3):
        crash_and_wait(apps["rollout"])
    assert apps["rollout"].starts == 3
    apps["rollout"].code = 1
    supervisor.tick()  # a fourth death within 10 minutes: left out, the other server goes on
    assert apps["rollout"].state.startswith("left out of the fleet: exited with status 1, after 3 restarts within")
    assert "the fleet goes on without it" in said[-1]
    clock.now += 3600
    supervisor.tick()
    assert apps["rollout"].starts == 3  # never started again
    for _ in range(3):
        crash_and_wait(apps["rollout-2"])
    apps["rollout-2"].code = -signal.SIGSEGV
    with pytest.raises(ChildFailed, match="no rollout server is left to play the trainer's games"):
        supervisor.tick()


def test_restarts_older_than_the_window_are_forgotten(fleet) -> None:
    supervisor, apps, clock, _ = fleet
    rollout = apps["rollout"]
    for _ in range(6):  # a death 15 minutes after each restart: never more than one restart within 10 minutes
        rollout.code = 1
        supervisor.tick()
        assert rollout.state == "exited (exited with status 1); restarting in 5 s"
        clock.now += 5
        supervisor.tick()
        rollout.answers = True
        supervisor.tick()
        clock.now += 900
    assert rollout.starts == 6 and rollout.state == "ready"


@pytest.mark.parametrize("name", ["env", "trainer"])
def test_the_env_or_the_trainer_exiting_stops_everything(fleet, name: str) -> None:
    supervisor, apps, _, _ = fleet
    apps[name].code = 3
    with pytest.raises(ChildFailed, match=rf"the {name} app exited with status 3; the end of its log"):
        supervisor.tick()


def test_a_restarted_server_that_never_gets_ready_counts_as_one_more_exit(fleet) -> None:
    supervisor, apps, clock, _ = fleet
    rollout = apps["rollout"]
    rollout.code = 1
    supervisor.tick()
    clock.now += 5
    supervisor.tick()
    clock.now += 301
    supervisor.tick()  # still not answering after --ready-timeout: stopped, and restarted later
    assert rollout.stops == 1
    assert rollout.state == "exited (was not ready 300 s after its restart); restarting in 10 s"


def test_the_policy_doubles_its_wait_up_to_a_ceiling() -> None:
    policy = RestartPolicy(first_wait_s=5, max_wait_s=30)
    assert [policy.wait_s(n) for n in range(1, 6)] == [5, 10, 20, 30, 30]
    with pytest.raises(ValueError, match="invalid restart policy"):
        RestartPolicy(max_restarts=-1)
