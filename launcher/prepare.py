"""The model, prepared once before the apps start, in a child process so the launcher stays light.

``python -m launcher.prepare MODEL`` resolves MODEL with `models.resolve_model` (the offline default is
converted from its GGUF on first use, with a progress bar on stderr) and prints the folder as its last
line of stdout. The launcher then hands that folder to the rollout and the trainer, so neither converts.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading

from .config import REPO


def preparing_text(model: str) -> str:
    """What the launcher says before `prepare_model`: that it converts the offline model only when that is still to be
    done (it said "preparing the model (once ...)" at every start, the converted folder long there)."""
    from models import DEFAULT_MODEL
    from models.smollm2 import smollm2_folder

    if os.path.isdir(model):
        return f"model {model}: a folder, used as it is"
    if model != DEFAULT_MODEL:
        return f"getting the model {model} (from the Hub's cache, or downloaded the first time)"
    try:
        folder = smollm2_folder()
    except importlib.metadata.PackageNotFoundError:
        return f"preparing the model {model}"  # the preparer says what to install
    if os.path.isdir(folder):
        return f"model {model}: converted on an earlier start, in {folder}"
    return f"preparing the model {model}: converting it once (~40 s on 2 cores; later starts reuse it)"


class PrepareFailed(RuntimeError):
    """The model could not be prepared; the message carries the preparer's own error."""


def prepare_model(model: str, stop: threading.Event) -> str | None:
    """A local folder for `model`, converting the offline default on first use (progress on stderr).

    A folder is returned as it is, without a child process. Returns None when `stop` is set first.

    Raises:
        PrepareFailed: the model is not a folder, the offline wheel is missing, or a Hub id failed.
    """
    if os.path.isdir(model):
        return model
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.prepare", model],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # stderr passes through as it comes, in chunks: progress bars redraw with \r, not newlines.
    tail = bytearray()

    def relay() -> None:
        assert proc.stderr is not None
        while chunk := os.read(proc.stderr.fileno(), 4096):
            tail.extend(chunk)
            del tail[:-8192]
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()

    relay_thread = threading.Thread(target=relay, daemon=True)
    relay_thread.start()
    while proc.poll() is None:
        if stop.wait(0.2):
            proc.terminate()
            proc.wait(timeout=30)
            return None
    relay_thread.join(timeout=5)
    assert proc.stdout is not None
    out = proc.stdout.read().decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not out:
        lines = [line.strip() for line in tail.decode(errors="replace").splitlines() if line.strip()]
        error = lines[-1] if lines else f"exit status {proc.returncode}"
        raise PrepareFailed(f"cannot prepare the model {model!r}: {error}")
    return out[-1]


def main(argv: list[str]) -> None:
    """Resolve argv[0] to a folder and print it."""
    from models import resolve_model

    try:
        folder = resolve_model(argv[0])
    except (FileNotFoundError, RuntimeError) as e:  # the two resolve_model documents; their messages say what to do
        print(str(e).replace("\n", " "), file=sys.stderr)
        raise SystemExit(1) from e
    print(folder, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
