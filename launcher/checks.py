"""Settings a role cannot run without, checked before it starts, with messages that say what to set.

Locally every flag has a working default (one local bucket, loopback URLs). On a Hugging Face Space
(``SPACE_ID`` is set there) those defaults are wrong: the Spaces share nothing but the bucket and
HTTP, so the bucket must be remote storage and the URLs must name the other Spaces.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from urllib.parse import urlparse

import settings

#: argparse destination -> the shared setting checked here.
SETTINGS: dict[str, settings.Setting] = {
    "bucket": settings.BUCKET,
    "rollout_url": settings.ROLLOUT_URL,
    "env_url": settings.ENV_URL,
    "device": settings.DEVICE,
}
#: The URL each role needs from another Space (the trainer's ENV_URL only links its UI's games).
NEEDED_URLS: dict[str, tuple[str, ...]] = {"rollout": ("env_url",), "trainer": ("rollout_url",)}
LOOPBACK = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


def _name(dest: str) -> str:
    setting = SETTINGS[dest]
    return f"{setting.variable} (or {setting.flag})"


def _is_remote_bucket(url: str) -> bool:
    return "://" in url and not url.startswith("file://")


def check_settings(role: str, args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """Problems with a role's settings: (errors that stop it, warnings to print).

    Args:
        role: ``env``, ``rollout``, ``trainer`` or ``all``.
        args: the role's parsed flags; only the attributes in `SETTINGS` are looked at.
        environ: the process environment (``SPACE_ID`` tells a Space; ``HF_TOKEN`` for hf:// buckets).
    """
    errors: list[str] = []
    warnings: list[str] = []
    on_space = bool(environ.get("SPACE_ID"))
    for dest in ("rollout_url", "env_url"):
        url = getattr(args, dest, None)
        if url is None:
            continue
        parsed = urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            errors.append(f"{_name(dest)} must be an http(s) URL such as https://USER-SPACE.hf.space, got {url!r}")
        elif on_space and dest in NEEDED_URLS.get(role, ()) and parsed.hostname in LOOPBACK:
            errors.append(
                f"set {_name(dest)} to the URL of your {dest.removesuffix('_url')} Space "
                f"(https://USER-SPACE.hf.space): {url!r} points back at this machine"
            )
    bucket = getattr(args, "bucket", None)
    if bucket is not None:
        if not bucket.strip():
            errors.append(f"set {_name('bucket')}: a folder, s3://BUCKET/PREFIX or hf://buckets/NS/NAME")
        elif on_space and not _is_remote_bucket(bucket):
            errors.append(
                f"set {_name('bucket')} to shared storage (hf://buckets/NS/NAME or s3://BUCKET/PREFIX): "
                f"the folder {bucket!r} is private to this Space and lost when it restarts"
            )
        elif bucket.startswith("hf://") and not _has_hf_token(environ):
            errors.append(
                f"the bucket {bucket} needs a Hugging Face token: set the HF_TOKEN secret "
                "(write access for the trainer, read for rollouts), or run `hf auth login`"
            )
    device = getattr(args, "device", None)
    if device is not None and not errors:  # torch tells what a device name means: asked only once the rest holds
        from models import resolve_device

        try:
            resolve_device(device)
        except ValueError as e:
            errors.append(f"{_name('device')}: {e}")
    if role == "all" and on_space:
        return [
            (
                "set the SPACE_ROLE variable of this Space to env, rollout or trainer: one Space runs one app "
                "(`python app.py` with no role runs all three on your own machine)"
            )
        ], warnings
    if role == "all":
        errors.extend(_launcher_problems(args))
    if role == "trainer" and on_space and not getattr(args, "owner_token", None):
        warnings.append(
            "OWNER_TOKEN is not set: nobody can start, pause or stop training from the UI; "
            "set it as a secret of this Space"
        )
    return errors, warnings


def _has_hf_token(environ: Mapping[str, str]) -> bool:
    """A token in the environment or saved by `hf auth login` (huggingface_hub's own lookup)."""
    if environ.get("HF_TOKEN"):
        return True
    from huggingface_hub import get_token

    return get_token() is not None


def _launcher_problems(args: argparse.Namespace) -> list[str]:
    """The all-in-one launch: a valid config, and its ports free."""
    import socket

    from .config import config_from_args

    try:
        config = config_from_args(args)
    except ValueError as e:
        return [str(e)]
    busy = []
    for flag, port in config.ports().items():
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
            try:
                s.bind((config.host, port))
            except OSError:
                busy.append(
                    f"port {port} ({flag}) is in use on {config.host}: stop what runs there "
                    "(another `python app.py`?) or choose another port"
                )
    return busy
