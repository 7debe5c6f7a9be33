"""One entry point for everything: ``python app.py [ROLE] [options]``.

- ``python app.py``: all three apps on this machine (env, rollout, trainer on one local bucket) and a
  landing page at http://127.0.0.1:7860; Ctrl-C stops them. Flags: ``python app.py all --help``.
- ``python app.py env|rollout|trainer``: one app, which is how each Hugging Face Space starts
  (a Space sets ``SPACE_ROLE`` instead of the argument). Flags: ``python app.py ROLE --help``.

Every flag defaults to an environment variable (a Space's variables and secrets): DELTA_BUCKET,
ROLLOUT_URL, ENV_URL, MODEL, ENGINE, DEVICE, OWNER_TOKEN, ENV_TOKEN, ROLLOUT_TOKEN, HF_TOKEN,
GRADIO_SERVER_NAME/PORT; the shared ones are defined once, in ``settings.py``. ``APP_ARGS`` holds more
flags for the role (a Space variable: ``--learning-rate 1e-5 --max-turns 6``), read before the command
line's, which win.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import shlex
import signal
import sys
from types import FrameType, ModuleType

#: Role name -> (module with `add_arguments`, module with `run`, one-line description). Imported only when asked
#: for; the first is light (no torch, transformers or Gradio), so a wrong flag is answered before the second loads.
ROLES: dict[str, tuple[str, str, str]] = {
    "env": ("env_space.launch", "env_space.launch", "the Wordle environment: UI and HTTP API"),
    "rollout": ("rollout_space.launch", "rollout_space.main", "the inference server: follows the bucket, plays games"),
    "trainer": ("trainer_space.launch", "trainer_space.main", "TRL GRPO training: publishes deltas to the bucket"),
    "all": (
        "launcher.config",
        "launcher.launch",
        "env + rollout + trainer as three local processes, and a landing page",
    ),
}
PROG = "app.py"


def _fail(message: str) -> None:
    """Print an argparse-style error and exit 2."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _usage() -> str:
    roles = "\n".join(f"  {name:<8} {text}" for name, (_, _, text) in ROLES.items())
    return f"usage: {PROG} [ROLE] [options]\n\n{__doc__}\nroles:\n{roles}\n"


def pick_role(argv: list[str], environ: dict[str, str] | os._Environ[str]) -> tuple[str, list[str]]:
    """The role to run and the arguments left for it.

    The first argument names the role; without one, ``SPACE_ROLE`` does; without that, ``all``.

    Raises:
        SystemExit: an unknown role (the message says what to set).
    """
    names = ", ".join(n for n in ROLES if n != "all")
    if argv and not argv[0].startswith("-"):
        role, rest = argv[0], argv[1:]
        if role not in ROLES:
            _fail(
                f"unknown role {role!r}: name one of {names} (e.g. `python {PROG} env`), "
                f"or none to run all three; a Space sets the SPACE_ROLE variable instead"
            )
        return role, rest
    role = environ.get("SPACE_ROLE", "").strip()
    if role and role not in ROLES:
        _fail(
            f"SPACE_ROLE={role!r} is not a role: set the SPACE_ROLE variable to one of {names}, "
            f"or unset it to run all three"
        )
    return role or "all", argv


def _load(role: str, module: str) -> ModuleType:
    """Import one of the role's modules, turning a missing dependency into an install hint."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] == module.split(".")[0]:
            raise
        _fail(
            f"the {role} role needs the package {e.name!r}, which is not installed: run "
            f"`bash scripts/install.sh` (or `pip install -r requirements.txt -c constraints.txt`)"
        )
        raise  # unreachable: _fail exits


def _stop_on_signals() -> None:
    """Make SIGTERM (a Space restarting, the launcher or `bench.trainer` stopping an app) and SIGINT (Ctrl-C) end a
    role the same way, through its cleanup: the trainer flushes its last version to the bucket, the rollout closes
    its engine; and start the exit deadline (`dashboard.deadline`) at the first of them.

    While a role serves, uvicorn takes both signals (`dashboard.serving.UIServer`, which starts the deadline too),
    shuts the server down and raises the signal again: the role is stopping already, so that is ignored and its
    cleanup runs on. Before and after serving, the first signal unwinds the main thread (SystemExit) through the
    role's ``finally`` blocks; a later one is ignored, so it cannot cut the cleanup short (the deadline bounds it).
    Left to their defaults, SIGTERM would end the process on the spot, skipping every ``finally``, and SIGINT would
    end it with a KeyboardInterrupt traceback and Python's slow finalization.
    """
    from dashboard import deadline

    def stop(signum: int, frame: FrameType | None) -> None:
        if deadline.arm(signum):
            raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def _configure_logging() -> None:
    """One log format for every role: time, logger, message, INFO and up. httpx, which logs every request it
    sends at INFO (the rollout's to the env: several lines a second), only from WARNING."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def main(argv: list[str]) -> None:
    """Parse the role and its flags, check the settings a Space must give, run the role until stopped."""
    if argv[:1] in (["-h"], ["--help"]):
        print(_usage(), end="")
        return
    role, rest = pick_role(argv, os.environ)
    rest = shlex.split(os.environ.get("APP_ARGS", "")) + rest
    flags, runs, description = ROLES[role]
    parser = argparse.ArgumentParser(prog=f"{PROG} {role}", description=description)
    _load(role, flags).add_arguments(parser)
    args = parser.parse_args(rest)

    from launcher.checks import check_settings

    errors, warnings = check_settings(role, args, os.environ)
    for warning in warnings:
        print(f"{PROG} {role}: warning: {warning}", file=sys.stderr)
    if errors:
        parser.error("; ".join(errors))
    if role != "all":  # the launcher handles its own signals (it stops its apps)
        _stop_on_signals()
    _configure_logging()
    launch = _load(role, runs)
    try:
        launch.run(args)
    except SystemExit as e:  # a signal's way out (`_stop_on_signals`)
        if e.code not in (0, None):
            raise
    _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """End the process once the role's own cleanup has run (each closes its engine, threads and files before
    `run` returns): Python's finalization would only free memory the OS takes back anyway, and collecting a heap
    of torch, transformers and Gradio objects took 6-17 s of a stop on a busy 2-core machine (measured: the
    main thread "Garbage-collecting" after every thread had ended). It would also abort the process (signal 6)
    if a thread left running past its bounded wait were inside a torch operation."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
