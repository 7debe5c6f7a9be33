"""The package installed as a user's `pip install` would, for a real `vllm serve` (bench/_vllm_serve.py) that
finds the `delta` backend through the package's `vllm.general_plugins` entry point and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bench._vllm_serve import REPO, VLLMServer

__all__ = ["VLLMServer", "install_package"]


def install_package(target: Path) -> Path:
    """Install this checkout's `delta` package (code + metadata with its entry points) into `target`."""
    src = target.parent / "delta-src"
    for package in ("delta", "delta_vllm_plugin"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    (src / "docs").mkdir()
    shutil.copy(REPO / "docs" / "delta.md", src / "docs")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True, capture_output=True)
    return target
