"""`python -m delta follow`: make a running `vllm serve` follow a bucket, version by version.

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model MODEL \
        --weight-transfer-config '{"backend":"delta"}' &
    python -m delta follow --bucket s3://bucket/run --vllm-url http://127.0.0.1:8000

A `delta.Subscriber` decodes each version while the server serves; the sidecar then writes the new values to an
update file, pauses generation, drives the `delta` backend's start / update / finish, and resumes. Only the
trainer's versions are applied (`Bucket.trust`). At start and after a failed apply the server stays paused while
the whole state is rebuilt and sent: a half-applied version is never served.

A LoRA run's adapter versions reach a stock `vllm serve --enable-lora` with no backend (`AdapterFollower`): each
is loaded as ``adapter-v<version>`` and the last `keep` stay loaded; nothing pauses."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import typing
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .atomic import write_atomic
from .bucket.handle import Bucket
from .bucket.subscribe import Subscriber, SubscriberConfig, Update
from .bucket.trust import Trust
from .errors import AdapterRefusedError, UntrustedVersionError, printable
from .integrations.peft_adapter import adapter_config, write_adapter
from .integrations.vllm_http import VLLMHTTPClient, VLLMServerError
from .integrations.vllm_update import WorkerInfo, fused_groups, read_worker_info, whole_groups, write_update
from .poll import Backoff

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_KEEP",
    "AdapterFollower",
    "AdapterRefusedError",
    "AdapterRun",
    "AppliedVersion",
    "FollowConfig",
    "FollowStatus",
    "ServerFollower",
    "add_arguments",
    "add_trust_arguments",
    "base_hash_of",
    "follow_config",
    "run_until_stopped",
]


def _flag(help: str, name: str | None = None) -> dict[str, str | None]:
    """A `FollowConfig` field's flag: its help, and its name where it is not the field's."""
    return {"help": help, "flag": name}


@dataclass(frozen=True)
class FollowConfig:
    """Settings of a follower; each field's help is its flag's (`add_arguments`)."""

    bucket: str = field(metadata=_flag("local folder, s3://bucket[/prefix] or hf://buckets/ns/name"))
    vllm_url: str = field(metadata=_flag("the server's base URL, e.g. http://127.0.0.1:8000"))
    work_dir: str | None = field(
        default=None,
        metadata=_flag(
            "folder for update files and the worker handshake, readable by the server (default: a "
            "temporary one, same machine)"
        ),
    )
    status_path: str | None = field(
        default=None, metadata=_flag("JSON status written after every event", "--status-file")
    )
    poll_interval: float | None = field(
        default=None,
        metadata=_flag(
            "seconds between bucket polls while versions come (default: the bucket's budget: 1 s on a "
            "folder or S3, 2 s on hf://)"
        ),
    )
    ready_timeout: float = field(default=600.0, metadata=_flag("seconds to wait for the server at start"))
    #: Seconds to wait for each server answer.
    request_timeout: float = 600.0
    #: Longest wait between attempts to recover after failures (after a 429: until the time the bucket named).
    max_backoff: float = 30.0
    #: Longest wait between polls while nothing new comes (doubling from `poll_interval`, back to it at the first new
    #: version); None: the bucket's budget (`Budget.idle_poll_s`: 30 s on the Hub).
    idle_poll_max: float | None = None
    #: Applied versions kept in the status.
    history: int = 20
    trusted_key: str | None = field(
        default=None,
        metadata=_flag(
            "the trainer's public key, ed25519:..., or a file holding it: only versions it signed are "
            "applied (env DELTA_TRUSTED_KEY; default: the key of the first signed version, kept per bucket "
            "in ~/.cache/delta/trusted, as ssh does)"
        ),
    )
    unauthenticated: bool = field(
        default=False,
        metadata=_flag(
            "follow an unsigned bucket (TRL's own delta files, an older delta's): every version is "
            "applied, whoever wrote it"
        ),
    )

    def __post_init__(self) -> None:
        SubscriberConfig(self.poll_interval, self.max_backoff, self.idle_poll_max)  # the same checks


@dataclass(frozen=True)
class AppliedVersion:
    """How one version reached the server: `via` "delta" (the changed tensors) or "full" (the whole state), the bytes
    read from the bucket, the update file's size and tensors, and how long generation was paused."""

    version: int
    via: str
    bytes_fetched: int
    update_bytes: int
    tensors: int
    pause_s: float


@dataclass
class FollowStatus:
    """What the status file holds: `state` (starting, waiting, paused, following or recovering), the versions
    `refused` by kind, and `trust` (which key versions are checked with)."""

    bucket: str
    vllm_url: str
    trust: str = ""
    authenticated: bool = True
    state: str = "starting"
    version: int | None = None
    latest: int | None = None
    failures: int = 0
    recoveries: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    applied: list[dict[str, Any]] = field(default_factory=list)
    updated_at: float = 0.0


class _Follower:
    """What both followers share: the server's client, the log, a working folder, the status file, and the loop that
    syncs, counts failures and backs off. `bucket` (None: opened from `config`) checks every version with its trust;
    its budget sets the polls."""

    def __init__(
        self,
        config: FollowConfig,
        client: VLLMHTTPClient | None,
        log: Callable[[str], None] | None,
        prefix: str,
        bucket: Bucket | None = None,
    ) -> None:
        self.bucket = bucket or Bucket.open(
            config.bucket, trusted_key=config.trusted_key, unauthenticated=config.unauthenticated
        )
        self.config = config
        self.polls = SubscriberConfig(config.poll_interval, config.max_backoff, config.idle_poll_max).for_budget(
            self.bucket.budget
        )
        self.client = client or VLLMHTTPClient(config.vllm_url, timeout=config.request_timeout)
        self._log = log or (lambda line: print(line, flush=True))
        self._tmp = None if config.work_dir else tempfile.TemporaryDirectory(prefix=prefix)
        self.work_dir: str = self._tmp.name if self._tmp is not None else (config.work_dir or "")  # one is set
        os.makedirs(self.work_dir, exist_ok=True)
        self.status = FollowStatus(config.bucket, config.vllm_url)
        self._history: deque[dict[str, Any]] = deque(maxlen=config.history)
        self._refusal: str | None = None  # the last refusal logged: each is logged and counted once

    @property
    def trust(self) -> Trust:
        """Whose versions are applied: the bucket's, for every subscriber this follower opens."""
        return self.bucket.trust

    def _subscriber(self, on_update: Callable[[Update], None] | None = None) -> Subscriber:
        """A subscriber on the bucket, checking versions with its trust."""
        return Subscriber(self.bucket, config=self.polls, on_update=on_update)

    def _sync(self, subscriber: Subscriber) -> int | None:
        """`subscriber.sync()`; a version the trusted key did not sign is refused (logged and counted once, the version
        held kept), not failed. Returns the version held."""
        try:
            return subscriber.sync()
        except UntrustedVersionError as e:
            text = printable(str(e))
            if text != self._refusal:
                self._refusal = text
                self.status.refused["untrusted version"] = self.status.refused.get("untrusted version", 0) + 1
                self.status.last_error = text
                self._log(f"REFUSED {text}")
            return subscriber.version
        finally:
            self.status.trust, self.status.authenticated = self.trust.describe(), not self.trust.unauthenticated

    def backoff(self) -> Backoff:
        """The waits between the follower's looks at the bucket: what a follower at rest costs it."""
        assert self.polls.poll_interval is not None  # resolved against the bucket's budget
        return Backoff(self.polls.poll_interval, self.polls.max_backoff, self.polls.idle_poll_max)

    def _follow(self, stop: threading.Event, until: int | None, step: Callable[[], None]) -> int | None:
        """Call `step` every poll until `stop` is set or version `until` (or newer) is served; returns the version
        served. A step that raises or leaves the follower not `_clean` is logged, counted and retried with a growing
        wait."""
        backoff = self.backoff()
        while not stop.is_set():
            seen = (self.status.latest, self.status.version)
            try:
                step()
                if self._clean():
                    backoff.succeeded(changed=(self.status.latest, self.status.version) != seen)
                else:
                    backoff.failed()
            except Exception as e:  # noqa: BLE001 - bucket or server down, a bad file, a bug: logged, counted, retried
                self._note_failure(e)
                backoff.failed(e)
            self._write_status()
            if until is not None and (self.status.version or -1) >= until and self._clean():
                break
            backoff.wait(stop)
        return self.status.version

    def _clean(self) -> bool:
        """Whether the server holds a known state (no failure left to recover from)."""
        return True

    def _note_failure(self, error: BaseException) -> None:
        self.status.failures += 1
        self.status.last_error = printable(f"{type(error).__name__}: {error}")
        logger.warning("delta follow: %s", self.status.last_error)

    def _write_status(self) -> None:
        self.status.applied = list(self._history)
        self.status.updated_at = time.time()
        if self.config.status_path:
            write_atomic(self.config.status_path, json.dumps(asdict(self.status), indent=1).encode())

    def _close_folder(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


class ServerFollower(_Follower):
    """Keeps one vLLM server (with the `delta` backend) at a bucket's newest version. `run` blocks its caller's thread;
    `client` defaults to `VLLMHTTPClient(config.vllm_url)`, `log` to printing each line."""

    def __init__(
        self,
        config: FollowConfig,
        client: VLLMHTTPClient | None = None,
        log: Callable[[str], None] | None = None,
        bucket: Bucket | None = None,
    ) -> None:
        super().__init__(config, client, log, "delta-follow-", bucket)
        self._following: Subscriber | None = None
        self._worker: WorkerInfo | None = None
        self._groups: dict[str, list[str]] = {}
        self._served: dict[str, torch.Tensor] | None = None  # CUDA only: what the server holds, for positions
        self._failed: BaseException | None = None

    # -- the loop ------------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, until: int | None = None) -> int | None:
        """Follow until `stop` is set, or until the server serves version `until` or newer; returns the version served.
        Bucket and server failures are logged, counted and retried (the server stays paused without a known state).

        Raises:
            VLLMServerError: the server did not answer within `ready_timeout` at start.
            FileNotFoundError: the server does not run the `delta` backend (no handshake).
        """
        stop = stop or threading.Event()
        self.client.wait_ready(self.config.ready_timeout)
        handshake = os.path.join(self.work_dir, "handshake")
        os.makedirs(handshake, exist_ok=True)
        self.client.init({"handshake_dir": handshake})
        self._worker = read_worker_info(handshake)
        return self._follow(stop, until, self._step)

    def close(self) -> None:
        if self._following is not None:
            self._following.close()
        self._close_folder()

    def _step(self) -> None:
        if self._following is None or self._failed is not None:
            self._recover()
        else:
            self._sync(self._following)
            self.status.latest = self._following.status().latest

    def _clean(self) -> bool:
        return self._failed is None

    # -- one version ---------------------------------------------------------------------------------

    def _on_update(self, update: Update) -> None:
        """Called by the subscriber once a version is decoded and written into its state: send it."""
        if self._failed is not None:
            return  # the server is paused on a failed version; recovery sends the whole state
        try:
            names = list(update.changed)
            assert self._following is not None and self._worker is not None  # set by `_recover` before any update
            state = self._following.state
            assert state is not None  # it has applied a version
            if self._worker.in_place:
                assert self._served is not None  # kept where the server updates in place
                new, old = {n: state[n] for n in names}, {n: self._served[n] for n in names}
            else:
                new, old = {n: state[n] for n in whole_groups(names, self._groups)}, None
            applied = self._send(new, old, update.version, "delta", update.stats.bytes_fetched)
            if self._served is not None:
                for n in names:
                    self._served[n].copy_(state[n])
            self._record(applied)
        except Exception as e:  # noqa: BLE001 - kept: the server stays paused until a whole state is applied
            self._failed = e
            self._note_failure(e)
            self._log(
                printable(
                    f"ERROR version {update.version} failed to apply: {type(e).__name__}: {e}; the server "
                    "stays paused until the newest anchor and the deltas after it are applied in full"
                )
            )

    def _send(
        self, new: dict[str, torch.Tensor], old: dict[str, torch.Tensor] | None, version: int, via: str, fetched: int
    ) -> AppliedVersion:
        """Write the update file (while serving), then pause, update, finish and resume; on failure the server is left
        paused for the caller to recover."""
        path = os.path.join(self.work_dir, f"update-{version}.safetensors")
        try:
            size = write_update(path, new, old)
            start = time.perf_counter()
            self.client.pause()
            self.status.state = "paused"
            self._start_update()
            self.client.update({"path": path, "version": version})
            self.client.finish_update(str(version))
            self.client.reset_prefix_cache()
            self.client.resume()
            pause = time.perf_counter() - start
        finally:
            if os.path.exists(path):
                os.unlink(path)
        self.status.state = "following"
        self.status.version = version
        return AppliedVersion(version, via, fetched, size, len(new), pause)

    def _recover(self) -> None:
        """Bring the server to a known state: keep it paused, rebuild the state from the newest anchor and
        the deltas after it, send all of it, then resume."""
        first = self._following is None and self._failed is None
        if not first:
            self.status.state = "recovering"
            self._write_status()
            self.client.pause()  # already paused after a failed version; pausing again is harmless
        fresh = self._subscriber()
        version = self._sync(fresh)  # newest anchor, then deltas; each signature, every file and the result checked
        if version is None:
            fresh.close()
            self.status.state = "waiting"  # nothing published yet: the server keeps its own weights
            return
        assert fresh.state is not None and self._worker is not None  # at `version`, for a known worker
        self._groups = fused_groups(fresh.state, self._worker.packed_modules)
        try:
            applied = self._send(
                dict(fresh.state), None, version, "full", sum(s.bytes_fetched for s in fresh.status().history)
            )
        except BaseException:
            fresh.close()
            raise
        if self._following is not None:
            self._following.close()
        self._following = fresh
        fresh.on_update = self._on_update  # from now on each version is sent as it is written
        self._served = {n: t.clone() for n, t in fresh.state.items()} if self._worker.in_place else None
        if self._failed is not None:
            self.status.recoveries += 1
            self._log(
                f"recovered: the server serves version {version} again, from the bucket's newest anchor "
                "and the deltas after it"
            )
        self._failed = None
        self.status.latest = fresh.status().latest
        self._record(applied)

    def _start_update(self) -> None:
        """Start a weight-update session, first closing one that a failed `finish` left open (vLLM refuses
        to start a second)."""
        try:
            self.client.start_update()
        except VLLMServerError as e:
            if e.status is None:  # unreachable: nothing to close
                raise
            self.client.finish_update(None)
            self.client.start_update()

    # -- status --------------------------------------------------------------------------------------

    def _record(self, applied: AppliedVersion) -> None:
        self._history.append(asdict(applied))
        self._log(
            f"version {applied.version} applied ({applied.via}): {applied.bytes_fetched:,} bytes fetched, "
            f"{applied.tensors} tensors ({applied.update_bytes:,} bytes) sent, pause {applied.pause_s:.3f} s"
        )
        self._write_status()


#: Most adapter versions an `AdapterFollower` keeps loaded (`AdapterRun.keep`, `--keep`): each is a PEFT folder in its
#: `work_dir` and one of the server's adapters. The product's runs ask for their staleness + 1, within the same cap.
MAX_KEEP = 16


@dataclass(frozen=True)
class AdapterRun:
    """What an adapter run's versions are loaded with: LoRA's `alpha`, the versions to `keep` loaded (staleness + 1),
    and what they must be (`r`, `targets`, the base's `base_hash`; None: taken from the tensors or not checked)."""

    alpha: float
    keep: int = 1
    r: int | None = None
    targets: tuple[str, ...] | None = None
    base_hash: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.keep <= MAX_KEEP:
            raise ValueError(
                f"keep must be 1 to {MAX_KEEP} adapter versions (each a folder on disk and one of the "
                f"server's adapters), got {self.keep}: lower --keep, or the run's staleness"
            )


def base_hash_of(folder: str) -> str:
    """The state hash of a model folder's tensors as a trainer publishes them (its safetensors files, in their
    dtypes): what a LoRA run names its base by. Reads the whole model."""
    from .tensors.hashing import state_digest
    from .tensors.state import load_state

    return state_digest(load_state(folder)).hexdigest


class AdapterFollower(_Follower):
    """Keeps a stock `vllm serve --enable-lora` serving a bucket's LoRA adapter versions, the last `keep` loaded, as
    the models ``<name>-v<version>``.

    `run` is the run's settings or a function that reads them before each version (it raises `AdapterRefusedError`
    for a run not to be loaded). A version is refused (one line, counted, the earlier ones still served) when its
    base is not the server's (`base_hash`), its rank is above `max_rank`, or its tensors are not the run's adapter
    (`peft_adapter.check_adapter`). Share `bucket` with whatever reads the run's settings: one trust."""

    def __init__(
        self,
        config: FollowConfig,
        run: AdapterRun | Callable[[], AdapterRun],
        base_hash: str | None = None,
        max_rank: int | None = None,
        name: str = "adapter",
        client: VLLMHTTPClient | None = None,
        log: Callable[[str], None] | None = None,
        bucket: Bucket | None = None,
    ) -> None:
        super().__init__(config, client, log, "delta-adapters-", bucket)
        self._run = run if callable(run) else (lambda: run)
        self.base_hash, self.max_rank, self.name = base_hash, max_rank, name
        self.loaded: list[int] = []  # adapter versions the server holds, oldest first
        self._following = self._subscriber(self._on_update)

    def served_name(self, version: int) -> str:
        """The model name requests give to be served by adapter `version`."""
        return f"{self.name}-v{version}"

    def run(self, stop: threading.Event | None = None, until: int | None = None) -> int | None:
        """Follow until `stop` is set or adapter version `until` (or newer) is loaded; returns the newest loaded.
        Failures are logged, counted and retried with a growing wait.

        Raises:
            VLLMServerError: the server did not answer within `ready_timeout` at start.
        """
        stop = stop or threading.Event()
        self.client.wait_ready(self.config.ready_timeout)
        self.status.state = "following"
        return self._follow(stop, until, self._step)

    def close(self) -> None:
        self._following.close()
        self._close_folder()

    def _step(self) -> None:
        self._sync(self._following)
        self.status.latest = self._following.status().latest

    def _adapter_config(self, state: dict[str, torch.Tensor]) -> tuple[Any, int]:
        """The `peft.LoraConfig` to load `state` with, and the versions to keep, once `state` is checked against the run
        and the server (else `AdapterRefusedError`)."""
        run = self._run()
        if run.base_hash is not None and self.base_hash is not None and run.base_hash != self.base_hash:
            raise AdapterRefusedError(
                f"the run trains its adapter on base {run.base_hash}; this server's model hashes "
                f"to {self.base_hash}: start the server with the run's base model",
                "another base",
            )
        try:
            config = adapter_config(state, run.alpha, run.r, run.targets)
        except ValueError as e:
            raise AdapterRefusedError(str(e), "bad adapter") from e
        if self.max_rank is not None and config.r > self.max_rank:
            raise AdapterRefusedError(
                f"the run's adapter has rank {config.r}, above this server's max LoRA rank "
                f"{self.max_rank}: restart vllm serve with --max-lora-rank {config.r} or more",
                "rank above max",
            )
        return config, run.keep

    def _on_update(self, update: Update) -> None:
        """Load the adapter at the version just decoded and unload the oldest beyond `keep`; a refused version is logged
        and counted, the ones before it stay served."""
        assert self._following is not None and self._following.state is not None  # it decoded this update
        version, state = update.version, self._following.state
        folder = os.path.join(self.work_dir, f"v{version}")
        try:
            config, keep = self._adapter_config(state)
            write_adapter(folder, state, config)
            self.client.load_lora_adapter(self.served_name(version), folder)
        except AdapterRefusedError as e:
            self.status.refused[e.reason] = self.status.refused.get(e.reason, 0) + 1
            self.status.last_error = printable(f"{e.reason}: {e}")
            self._log(printable(f"REFUSED adapter version {version} ({e.reason}): {e}"))
            self._write_status()
            return
        except (ValueError, OSError) as e:
            shutil.rmtree(folder, ignore_errors=True)
            self._note_failure(e)
            self._log(printable(f"ERROR adapter version {version} not loaded: {type(e).__name__}: {e}"))
            return
        self.loaded.append(version)
        while len(self.loaded) > keep:
            old = self.loaded.pop(0)
            self.client.unload_lora_adapter(self.served_name(old))
            shutil.rmtree(os.path.join(self.work_dir, f"v{old}"), ignore_errors=True)
        self.status.version = version
        fetched = update.stats.bytes_fetched
        self._history.append({"version": version, "via": update.stats.via, "bytes_fetched": fetched})
        self._log(
            f"adapter version {version} loaded as {self.served_name(version)} ({fetched:,} bytes fetched); "
            f"serving {', '.join(self.served_name(v) for v in self.loaded)}"
        )
        self._write_status()


# -- `python -m delta follow` ------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser, names: tuple[str, ...] | None = None) -> None:
    """A flag for each `FollowConfig` field (of `names`, when given), read as the field's type with its default, and
    for a stock LoRA server `--keep` and `--max-lora-rank`, and `--until`."""
    hints = typing.get_type_hints(FollowConfig)
    for f in dataclasses.fields(FollowConfig):
        if "help" not in f.metadata or (names is not None and f.name not in names):
            continue
        name, kind = f.metadata["flag"] or "--" + f.name.replace("_", "-"), hints[f.name]
        if kind is bool:
            p.add_argument(name, action="store_true", help=f.metadata["help"])
            continue
        required = f.default is dataclasses.MISSING
        kind = next((k for k in typing.get_args(kind) if k is not type(None)), kind)
        p.add_argument(
            name,
            type=kind,
            required=required,
            default=None if required else f.default,
            dest=f.name,
            help=f.metadata["help"],
        )
    if names is not None:
        return
    p.add_argument("--until", type=int, default=None, help="exit once the server serves this version or newer")
    p.add_argument(
        "--keep",
        type=_versions,
        default=None,
        help=f"adapter versions kept loaded on a LoRA server, 1 to {MAX_KEEP} (default: the run's staleness + 1, or 1)",
    )
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        help="the LoRA server's --max-lora-rank: adapter versions of a higher rank are refused before "
        "loading (default: the server refuses them itself, each a failure)",
    )


def add_trust_arguments(p: argparse.ArgumentParser) -> None:
    """`--trusted-key` and `--unauthenticated`: whose versions a reader of a bucket applies."""
    add_arguments(p, ("trusted_key", "unauthenticated"))


def _versions(text: str) -> int:
    """`--keep`'s value: a number of adapter versions, 1 to `MAX_KEEP`."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_KEEP:
        raise argparse.ArgumentTypeError(f"must be a number of adapter versions, 1 to {MAX_KEEP}; got {text!r}")
    return int(text)


def follow_config(args: argparse.Namespace) -> FollowConfig:
    """The `FollowConfig` of `add_arguments`' flags."""
    return FollowConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(FollowConfig) if f.metadata})


def run_until_stopped(follower: ServerFollower | AdapterFollower, until: int | None) -> int:
    """Run `follower` until `until` is served or Ctrl-C, close it and say what the server serves; exit status 0. A
    server that never answered, or answers without the `delta` backend, ends it in one line: exit status 1."""
    try:
        version = follower.run(threading.Event(), until=until)
    except KeyboardInterrupt:
        version = follower.status.version
    except (VLLMServerError, FileNotFoundError) as e:
        print(f"error: {printable(str(e))}", file=sys.stderr, flush=True)
        return 1
    finally:
        follower.close()
    print(f"stopped; the server serves version {version}", flush=True)
    return 0


def add_command(subparsers: Any) -> None:
    """Add the `follow` subcommand to `python -m delta`'s parser."""
    p = subparsers.add_parser("follow", help="make a running `vllm serve` (backend delta) follow a bucket")
    add_arguments(p)
    p.add_argument(
        "--lora-alpha",
        type=float,
        default=None,
        help="the bucket holds a LoRA run's adapter versions (adapter mode) with this alpha: load each into "
        "a stock `vllm serve --enable-lora` as the model adapter-v<version> (needs "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 on the server)",
    )
    p.set_defaults(func=_cmd_follow)


def _cmd_follow(args: argparse.Namespace) -> int:
    config = follow_config(args)
    if args.lora_alpha is None:
        return run_until_stopped(ServerFollower(config), args.until)
    run = AdapterRun(args.lora_alpha, keep=1 if args.keep is None else args.keep)
    return run_until_stopped(AdapterFollower(config, run, max_rank=args.max_lora_rank), args.until)
