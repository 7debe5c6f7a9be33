"""`--device`: auto picks what is there; a device that is not there is refused before anything starts."""

from __future__ import annotations

import argparse

import pytest
import torch

from launcher.checks import check_settings
from models import resolve_device


def test_auto_and_cpu_resolve_to_a_device_that_is_there() -> None:
    assert resolve_device("auto") == resolve_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device(" CPU ") == "cpu"


@pytest.mark.parametrize("name", ["tpu", "cuda:x", "gpu0", ""])
def test_unknown_names_are_refused_with_the_choices(name: str) -> None:
    if not name:  # empty means auto (an unset variable)
        assert resolve_device(name) in ("cpu", "cuda")
        return
    with pytest.raises(ValueError, match="auto, cpu, cuda or cuda:N"):
        resolve_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_a_gpu_stops_the_role_with_what_to_do() -> None:
    with pytest.raises(ValueError, match="sees no GPU; use --device cpu"):
        resolve_device("cuda")
    errors, _ = check_settings("trainer", argparse.Namespace(device="cuda"), {})
    assert len(errors) == 1 and errors[0].startswith("DEVICE (or --device): device 'cuda' asked for")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_gpu_index_beyond_the_machines_is_refused() -> None:
    with pytest.raises(ValueError, match="does not exist"):
        resolve_device(f"cuda:{torch.cuda.device_count()}")
