"""The all-in-one launcher's settings: one dataclass, its flags, and the environment variables behind them."""

from __future__ import annotations

import argparse
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import settings

#: The repository: children run here, and the default bucket and logs live under it.
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class LauncherConfig:
    """Where the three apps listen, what they share, and how long the launcher waits for them.

    Args:
        host: Address every app listens on (loopback by default: nothing is exposed).
        port: The landing page's port.
        env_port / rollout_port / trainer_port: The three apps' ports; further rollout servers listen on
            the ports after the trainer's (`rollout_ports`).
        rollouts: Rollout servers to start, all on the one bucket (the fleet).
        bucket: The bucket all three share: a folder (default `.cache/bucket` in the repository, so a
            second start resumes from it), `s3://...` or `hf://buckets/NS/NAME`.
        model: Model folder or Hub id; the default is the offline SmolLM2-135M-Instruct.
        engine: Rollout engine, `vllm` or `transformers`; None lets the rollout pick (vllm with a GPU).
        owner_token: The trainer's control secret; None: the launcher makes one and prints it.
        logs: Folder of the children's log files (one per app, appended to).
        keys: Folder of the tokens the launcher made, kept between starts, one owner-only file per bucket
            (`tokens.KeptTokens`; never in the bucket): records signed before a restart still verify.
        ready_timeout_s: Seconds each app may take to answer its health check.
        stop_timeout_s: Seconds each app gets to exit after SIGTERM before its process group is killed.
        rollout_restarts: Restarts of a rollout server that dies, within 10 minutes, waiting 5 s, 10 s, 20 s...
            before each (`restarts.RestartPolicy`); past them it stays stopped and the fleet goes on without it.
        rollout_args / trainer_args: Extra flags for those two roles (e.g. smaller batches in tests).
    """

    host: str = settings.DEFAULT_HOST
    port: int = settings.DEFAULT_PORT
    env_port: int = 7861
    rollout_port: int = 7862
    trainer_port: int = 7863
    rollouts: int = 1
    bucket: str = str(REPO / settings.DEFAULT_BUCKET)
    model: str = settings.DEFAULT_MODEL
    engine: str | None = None
    owner_token: str | None = None
    logs: str = str(REPO / ".cache" / "app" / "logs")
    keys: str = str(REPO / ".cache" / "app" / "keys")
    ready_timeout_s: float = 900.0
    stop_timeout_s: float = settings.STOP_TIMEOUT_S
    rollout_restarts: int = 3
    rollout_args: list[str] = field(default_factory=list)
    trainer_args: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.rollouts <= 16:
            raise ValueError(f"--rollouts must be between 1 and 16, got {self.rollouts}")
        ports = self.ports()
        for flag, port in ports.items():
            if not 0 < port < 65536:
                raise ValueError(f"{flag} must be a port between 1 and 65535, got {port}")
        if len(set(ports.values())) != len(ports):
            raise ValueError(
                f"the apps' ports must differ, got {ports}: change --port/--env-port/--rollout-port/--trainer-port"
            )
        if self.ready_timeout_s <= 0 or self.stop_timeout_s <= 0:
            raise ValueError("--ready-timeout and --stop-timeout must be > 0 seconds")
        if self.rollout_restarts < 0:
            raise ValueError(f"--rollout-restarts must be 0 or more, got {self.rollout_restarts}")

    @property
    def rollout_ports(self) -> list[int]:
        """The rollout servers' ports: `rollout_port`, then the ports after the trainer's."""
        return [self.rollout_port] + [self.trainer_port + i for i in range(1, self.rollouts)]

    def ports(self) -> dict[str, int]:
        """Flag -> port, for the checks and their messages."""
        extra = {f"--rollouts (server {i + 2})": p for i, p in enumerate(self.rollout_ports[1:])}
        return {
            "--port": self.port,
            "--env-port": self.env_port,
            "--rollout-port": self.rollout_port,
            "--trainer-port": self.trainer_port,
            **extra,
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags; bucket, model, engine and owner token default to the shared variables."""
    d = LauncherConfig()
    parser.add_argument("--host", default=d.host, help="address all four servers listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=d.port, help="landing page port (default 7860)")
    parser.add_argument("--env-port", type=int, default=d.env_port, help="Wordle env port (default 7861)")
    parser.add_argument("--rollout-port", type=int, default=d.rollout_port, help="rollout port (default 7862)")
    parser.add_argument("--trainer-port", type=int, default=d.trainer_port, help="trainer port (default 7863)")
    parser.add_argument(
        "--rollouts",
        type=int,
        default=d.rollouts,
        help="rollout servers to start on the one bucket (default 1); the second and later listen "
        "on the ports after the trainer's",
    )
    settings.BUCKET.add_to(
        parser, "bucket shared by rollout and trainer (in the repository, so a second start resumes)"
    )
    settings.MODEL.add_to(parser, "model folder or Hub id (offline default, prepared once)")
    settings.ENGINE.add_to(parser)
    settings.OWNER_TOKEN.add_to(
        parser, "trainer control secret (unset: the one kept for the bucket, or a new one; printed)"
    )
    parser.add_argument("--logs", default=d.logs, help="folder of the three apps' logs (default .cache/app/logs)")
    parser.add_argument(
        "--keys",
        default=d.keys,
        help="folder where the tokens the launcher makes are kept between starts, one owner-only file "
        "per bucket, never in the bucket (default .cache/app/keys); ENV_TOKEN, ROLLOUT_TOKEN and "
        "OWNER_TOKEN, when set, win",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=d.ready_timeout_s,
        help="seconds each app may take to get ready (default 900)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=d.stop_timeout_s,
        help=f"seconds each app gets to exit on Ctrl-C before it is killed (default {d.stop_timeout_s:g})",
    )
    parser.add_argument(
        "--rollout-restarts",
        type=int,
        default=d.rollout_restarts,
        help=f"times a rollout server that dies is restarted within 10 minutes, after 5 s, 10 s, 20 s... "
        f"(default {d.rollout_restarts}; 0: never); then the fleet goes on without it",
    )
    parser.add_argument("--rollout-args", default="", help="extra flags for the rollout, one quoted string")
    parser.add_argument(
        "--trainer-args", default="", help='extra flags for the trainer, one quoted string (e.g. "--max-steps 50")'
    )


def config_from_args(args: argparse.Namespace) -> LauncherConfig:
    """The config from parsed flags (ValueError naming the flag when a value is wrong)."""
    # The apps run in the repository: folders given relative to the caller's directory become absolute.
    # The default bucket lives in the repository wherever the command is run from.
    bucket = (
        LauncherConfig.bucket
        if args.bucket == settings.DEFAULT_BUCKET
        else args.bucket
        if "://" in args.bucket
        else os.path.abspath(args.bucket)
    )
    model = os.path.abspath(args.model) if os.path.isdir(args.model) else args.model
    return LauncherConfig(
        host=args.host,
        port=args.port,
        env_port=args.env_port,
        rollout_port=args.rollout_port,
        trainer_port=args.trainer_port,
        rollouts=args.rollouts,
        bucket=bucket,
        model=model,
        engine=args.engine,
        owner_token=args.owner_token,
        logs=os.path.abspath(args.logs),
        keys=os.path.abspath(args.keys),
        ready_timeout_s=args.ready_timeout,
        stop_timeout_s=args.stop_timeout,
        rollout_restarts=args.rollout_restarts,
        rollout_args=shlex.split(args.rollout_args),
        trainer_args=shlex.split(args.trainer_args),
    )
