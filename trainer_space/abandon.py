"""Ending a training step part way, when the trainer process must exit now (SIGTERM, Ctrl-C).

Why: on a CPU a GRPO step computes for a minute, and a process that exits while its training thread is
inside a torch operation dies by signal 6. At interpreter exit Python ends the threads still running
(daemon threads) as each one takes the GIL back: one inside a torch operation takes it in a C++ destructor,
where that forced end cannot unwind, and the C++ runtime aborts ("terminate called without an active
exception"). So the training thread must end before the process does, and a step cannot be waited for.

`StepBreaker` ends it within one layer's time: hooks on every module's forward and on every parameter's
gradient raise `StepAbandoned` once `abandon` is called, out of the forward or backward pass in flight,
which ends `GRPOTrainer.train()`. The optimizer has not stepped (hooks fire before it) or has (then the
step's version is not published): either way the bucket keeps the last committed version, whole.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class StepAbandoned(Exception):
    """The step in flight was ended part way because the trainer is exiting; its weights are not published."""


class StepBreaker:
    """Hooks that end the step in flight once `abandon` was called (see the module docstring).

    Hooks cost one flag check per module call and per parameter gradient.
    """

    def __init__(self) -> None:
        self._abandoned = threading.Event()
        self._handles: list[Any] = []

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def attach(self, model: torch.nn.Module) -> None:
        """Hook every module's forward and every trainable parameter's gradient of `model` (the one being
        trained: a run may train another object than the one loaded)."""
        self.detach()
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._check))
        for parameter in model.parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_hook(self._check_grad))

    def detach(self) -> None:
        """Remove the hooks (the run ended)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def abandon(self) -> None:
        """End the step in flight at its next module or gradient, from any thread. Returns at once."""
        self._abandoned.set()

    def _check(self, *_: Any) -> None:
        if self._abandoned.is_set():
            raise StepAbandoned("the trainer is exiting: the step in flight was ended part way")

    def _check_grad(self, grad: torch.Tensor) -> None:
        self._check()
