"""Ending a model's forward or backward pass part way, when its process must exit now (SIGTERM, Ctrl-C).

Why: on a CPU a GRPO step computes for a minute and a prefill over long Wordle conversations for tens of
seconds, and neither can be waited for by a process asked to stop. Nor can its thread be left running: at
interpreter exit Python ends the threads still running (daemon threads) as each one takes the GIL back, and
one inside a torch operation takes it in a C++ destructor, where that forced end cannot unwind, so the C++
runtime aborts the process ("terminate called without an active exception", signal 6).

`Breaker` ends the pass within one module's time: hooks on every module's forward (and, for training, every
parameter's gradient) raise `Interrupted` once it is tripped. The trainer ends its step that way
(`trainer_space.session`): its optimizer has not stepped, or its version is not published; either way the
bucket keeps the last committed version whole. The transformers engine ends a generation that way
(`rollout_space.engines.transformers_engine`), prefill included, which its stopping criteria only see between
tokens.
"""

from __future__ import annotations

import threading
from typing import Any

import torch


class Interrupted(Exception):
    """A forward or backward pass was ended part way by `Breaker.trip` (its process is exiting)."""


class Breaker:
    """Hooks that end the forward or backward pass in flight once tripped. Each costs one flag check per module
    call (and per parameter gradient).

    Args:
        tripped: The event that trips it (an engine's "closing" event, say); default a fresh one, set by `trip`.
    """

    def __init__(self, tripped: threading.Event | None = None) -> None:
        self._tripped = tripped or threading.Event()
        self._handles: list[Any] = []

    def attach(self, model: torch.nn.Module, gradients: bool = True) -> None:
        """Hook every module's forward of `model` (the object being run: a trainer may run another than the one
        loaded) and, with `gradients`, every trainable parameter's gradient."""
        self.detach()
        for module in model.modules():
            self._handles.append(module.register_forward_pre_hook(self._check))
        if gradients:
            for parameter in model.parameters():
                if parameter.requires_grad:
                    self._handles.append(parameter.register_hook(self._check))

    def detach(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def trip(self) -> None:
        """End the pass in flight at its next module or gradient, from any thread. Returns at once."""
        self._tripped.set()

    def _check(self, *_: Any) -> None:
        if self._tripped.is_set():
            raise Interrupted("the process is exiting: the pass in flight was ended part way")
