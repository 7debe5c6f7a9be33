"""``python app.py`` (role ``all``): env, rollout and trainer as three local processes, and a landing page.

Start-up: prepare the model once (progress shown), serve the landing page, start env, rollout(s) and
trainer, and print the URLs once all are healthy. Without a GPU they start at once (each loads its model
while the others do: the first step comes sooner); where vLLM shares a GPU with the trainer they start one
after the other, each waiting for the previous one's health, since vLLM sizes its share from the memory free
when it starts. While they
run, a rollout server that dies is restarted (`restarts.Supervisor`); the env or the trainer dying stops
everything. Ctrl-C or SIGTERM asks every app to stop at once, the trainer first (it commits its last
version); each gets `stop_timeout_s` before its process group is killed. The bucket stays, so the next
start resumes.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType

import delta
import settings
from delta import PublicKey
from delta.errors import KeyFormatError, PrivateFileError
from models.hardware import Machine, rollout_share_beside_trainer

from .children import Child, ChildFailed, stop_all
from .config import LauncherConfig, config_from_args
from .landing import LandingServer, build_app
from .prepare import PrepareFailed, prepare_model, preparing_text
from .restarts import RestartPolicy, Supervisor
from .tokens import KeptTokens, launch_tokens, role_environ


def _say(message: str) -> None:
    print(f"[app] {message}", flush=True)


def build_children(
    config: LauncherConfig,
    model_folder: str,
    owner_token: str,
    tokens: dict[str, str],
    gpu_share: float | None = None,
    trusted_key: str | None = None,
) -> list[Child]:
    """The apps in start order (env, the rollout servers, trainer), each holding the tokens it checks or sends
    (`tokens.launch_tokens()`); the rollout servers also the trainer's public key (`trusted_key`, as
    ``DELTA_TRUSTED_KEY``: they apply only the weights and run settings it signed). The trainer and the rollout
    servers share only the bucket: the rollout servers play games continuously and hand them in there (the
    fleet); the trainer needs no rollout URL; the servers let the trainer's first step train alone on the
    machine they share (``--first-step-alone``). `gpu_share`: each rollout server's vLLM memory share on a GPU
    the trainer shares (`models.hardware.rollout_share_beside_trainer`), unless the rollout's flags name one."""
    env_url = f"http://127.0.0.1:{config.env_port}"
    engine = ["--engine", config.engine] if config.engine else []
    if gpu_share is not None and "--gpu-memory-utilization" not in config.rollout_args:
        engine += ["--gpu-memory-utilization", f"{gpu_share:.2f}"]
    shared = ["--bucket", config.bucket, "--model", model_folder]

    def log(name: str) -> str:
        return os.path.join(config.logs, f"{name}.log")

    rollouts = []
    for i, port in enumerate(config.rollout_ports):
        name = "rollout" if i == 0 else f"rollout-{i + 1}"
        rollouts.append(
            Child(
                "rollout",
                config.host,
                port,
                [
                    *shared,
                    "--env-url",
                    env_url,
                    "--server-id",
                    name,
                    "--first-step-alone",
                    *engine,
                    *config.rollout_args,
                ],
                log(name),
                {**role_environ("rollout", tokens), **trusted(trusted_key)},
                name=name,
            )
        )
    return [
        Child("env", config.host, config.env_port, [], log("env"), role_environ("env", tokens)),
        *rollouts,
        Child(
            "trainer",
            config.host,
            config.trainer_port,
            [*shared, "--env-url", env_url, *config.trainer_args],
            log("trainer"),
            # A secret travels in the environment, not in argv where `ps` shows it to every local user.
            {"OWNER_TOKEN": owner_token, **role_environ("trainer", tokens)},
        ),
    ]


def trusted(key: str | None) -> dict[str, str]:
    """The variable that gives a rollout server the trainer's public key (none when `key` is None)."""
    variable = settings.TRUSTED_KEY.variable
    assert variable is not None  # the setting has its variable
    return {variable: key} if key else {}


def trainer_public_key(bucket: str) -> PublicKey:
    """The public key of the key the trainer will sign `bucket`'s versions with: its bucket's (``DELTA_SIGNING_KEY``,
    else the key kept for the bucket in the user's cache, made now at the first start)."""
    return delta.Bucket.open(bucket).signing_key.public


def start_together(config: LauncherConfig, machine: Machine | None) -> bool:
    """Whether the apps may start at once: unless vLLM may run on a GPU (`machine` has one and the engine is not
    transformers), where each must start after the previous one is healthy. `machine`: None when not probed
    (the transformers engine)."""
    return config.engine == "transformers" or machine is None or not machine.gpus


def _gpu_share(config: LauncherConfig, machine: Machine | None) -> float | None:
    """Each rollout server's vLLM memory share when they and the trainer share a GPU (None: no GPU, the
    transformers engine, or a share the person set with GPU_MEMORY_UTILIZATION)."""
    if machine is None or settings.GPU_MEMORY_UTILIZATION.value() is not None:
        return None
    try:
        share = rollout_share_beside_trainer(machine, config.rollouts)
    except ValueError as e:
        _say(str(e))
        raise SystemExit(1) from e
    if share is not None:
        _say(
            f"one GPU for the trainer and {config.rollouts} rollout server(s): each server's vLLM takes "
            f"{share:.2f} of its memory (GPU_MEMORY_UTILIZATION sets another share)"
        )
    return share


def _link(config: LauncherConfig, port: int) -> str:
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
    return f"http://{host}:{port}"


def run(args: argparse.Namespace) -> None:
    """Start everything, serve until Ctrl-C/SIGTERM or until an app dies, then stop everything. Blocks.

    Exits with status 1 when an app fails to start or dies while running (its log's end is printed).
    """
    config = config_from_args(args)
    stop = threading.Event()
    apps = 2 + config.rollouts

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not stop.is_set():
            _say(
                f"{signal.Signals(signum).name}: stopping all {apps} apps (each gets up to "
                f"{config.stop_timeout_s:.0f} s)"
            )
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    kept = KeptTokens(config.keys, config.bucket)
    try:
        tokens = launch_tokens(kept=kept, owner_token=config.owner_token)
    except PrivateFileError as e:  # a link, a FIFO or a folder where the tokens belong: one line, nothing followed
        _say(f"cannot use the kept tokens: {e}")
        raise SystemExit(1) from None
    try:
        key = trainer_public_key(config.bucket)
    except (PrivateFileError, KeyFormatError) as e:
        _say(f"cannot use the trainer's signing key: {e}")
        raise SystemExit(1) from None
    owner_token = tokens["OWNER_TOKEN"]
    _say(f"bucket {config.bucket} · logs {config.logs}")
    _say(preparing_text(config.model))
    try:
        folder = prepare_model(config.model, stop)
    except PrepareFailed as e:
        _say(str(e))
        raise SystemExit(1) from e
    if folder is None:
        return
    _say(f"model ready: {folder}")

    _say(
        f"tokens for this bucket kept in {kept.path} (owner-only; set ENV_TOKEN, ROLLOUT_TOKEN or OWNER_TOKEN "
        "to use others)"
    )
    machine = None if config.engine == "transformers" else Machine.probe()
    gpu_share = _gpu_share(config, machine)
    children = build_children(config, folder, owner_token, tokens, gpu_share, key.text)
    supervisor = Supervisor(children, RestartPolicy(max_restarts=config.rollout_restarts), config.ready_timeout_s, _say)
    landing = LandingServer(build_app(children, config.bucket, supervisor), config.host, config.port)
    failed = False
    try:
        landing.start()
        _say(f"landing page: {_link(config, config.port)} (shows each app as it gets ready)")
        waves = [children] if start_together(config, machine) else [[child] for child in children]
        for wave in waves:
            for child in wave:
                _say(f"starting {child.name} on {child.url} (log {child.log_path})")
                child.start()
            for child in wave:
                if not child.wait_ready(config.ready_timeout_s, stop):
                    return
                _say(f"{child.name} ready")
        _say("all apps are ready:")
        print(f"    landing page  {_link(config, config.port)}", flush=True)
        for child in children:
            print(f"    {child.name:<12}  {_link(config, child.port)}", flush=True)
        print(f"    owner token   {owner_token}   (the trainer's start/pause/stop)", flush=True)
        print(f"    rollout token {tokens['ROLLOUT_TOKEN']}   (the rollout's /generate and /rollout)", flush=True)
        print(f"    trainer key   {key.fingerprint}   (the rollout servers apply only what it signs)", flush=True)
        _say("Ctrl-C stops them all; the next start resumes from the bucket")
        while not stop.wait(1.0):
            supervisor.tick()
    except ChildFailed as e:
        failed = True
        _say(str(e))
    except RuntimeError as e:  # the landing page could not start
        failed = True
        _say(str(e))
    finally:
        stop_all(children, config.stop_timeout_s, _say)
        landing.stop()
    if failed:
        raise SystemExit(1)
    _say("all stopped")
    sys.stdout.flush()
