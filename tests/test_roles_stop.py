"""Every role of a working product stops by itself within `settings.STOP_WITHIN_S` of SIGTERM, as
`python -m bench.trainer run` stops them (all three at once, waited for side by side), and a role that does not
stop is killed after the bench's stop timeout, the run's JSON saying so.

Real processes (`python app.py ROLE`, started by the bench's own `role_children`) on loopback ports, a tiny model,
a temporary bucket. A GPU machine once saw `bench.trainer run` print nothing for 45 s after its last status line:
the roles were slow to stop, and the bench waited 60 s for each in turn.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import httpx

import settings
from bench.trainer import build_parser, role_children, save_run, stop_roles
from launcher.children import stop_all
from tests._trainer_stack import tiny_model, wait_until

#: What a clean stop leaves in no role's log: a traceback, a C++ abort, uvicorn cancelling requests, the exit
#: deadline's stack dump (`dashboard.deadline`).
NOT_IN_A_CLEAN_LOG = ("Traceback", "terminate called", "Aborted", "timeout graceful shutdown exceeded",
                      "CancelledError", "Timeout (0:")


def status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def test_every_role_of_a_working_product_stops_within_the_promise_on_sigterm(tmp_path: Path) -> None:
    model = tiny_model(str(tmp_path / "model"))
    args = build_parser().parse_args(
        ["run", "--model", model, "--device", "cpu", "--games", "8", "--num-generations", "2", "--max-tokens", "2",
         "--max-turns", "2", "--lr", "1e-3", "--exam-every", "0"])
    children = role_children(str(tmp_path), model, args)
    env, rollout, trainer = children
    try:
        for child in children:
            child.start()
            assert child.wait_ready(300, threading.Event())
        # Mid-work: the trainer trains and publishes, the rollout follows the bucket and plays games with the env.
        wait_until(lambda: status(trainer.url)["version"] >= 2, 300, "two published versions")
        wait_until(lambda: status(rollout.url)["version"] >= 1, 120, "the rollout to load a published version")
        assert status(trainer.url)["state"] == "running"
        stops = stop_roles(children, settings.STOP_TIMEOUT_S)
    finally:
        stop_all(children, 5, lambda _: None)  # no process left behind if the test failed part way
    for child in children:
        stop, log = stops[child.name], Path(child.log_path).read_text(errors="replace")
        # status 0: its own cleanup ended it, before `dashboard.deadline` would have (status 1, at STOP_DEADLINE_S)
        assert stop["code"] == 0 and not stop["killed"], f"{child.name}: {stop}\n{log[-3000:]}"
        assert stop["ended"].startswith("stopped in ")
        assert [bad for bad in NOT_IN_A_CLEAN_LOG if bad in log] == [], f"{child.name}.log:\n{log[-3000:]}"
        assert "SIGTERM: stopping" in log  # the signal reached the role itself, and started its deadline


def test_a_role_that_does_not_stop_is_killed_and_the_run_is_saved_saying_so(tmp_path: Path) -> None:
    args = build_parser().parse_args(["run", "--json", str(tmp_path / "run.json"), "--stop-timeout", "2"])
    env = role_children(str(tmp_path), "unused", args)[0]  # the env needs no model
    try:
        env.start()
        assert env.wait_ready(120, threading.Event())
        os.kill(env.pid, signal.SIGSTOP)  # it cannot act on SIGTERM now, as a role stuck in a driver call could not
        stops = stop_roles([env], args.stop_timeout)
    finally:
        stop_all([env], 5, lambda _: None)
    assert stops["env"]["killed"] and stops["env"]["code"] == -signal.SIGKILL
    assert stops["env"]["ended"].startswith("killed by bench.trainer: it did not stop within 2.")
    # Nothing answered at the end (the trainer never ran): the JSON is written anyway, with how each role ended.
    save_run(args, "python -m bench.trainer run --stop-timeout 2", None, None, None, [], stops, str(tmp_path))
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["killed_roles"] == ["env"] and saved["stops"] == stops and saved["status"] is None
    assert saved["logs"] == str(tmp_path)
