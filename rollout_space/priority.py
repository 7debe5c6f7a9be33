"""Public play never runs ahead of the trainer: a gate that UI and showcase games pass before each of
their turns, closed while any trainer request (``/generate``, ``/rollout``) is running.

The engine's own lock only orders calls as they come; without this gate a visitor's game could take
the engine between two turns of the trainer's rollout and make the trainer wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .engines import Completion, Engine, SamplingParams
from .engines.base import Prompt


class TrainerFirst:
    """Counts the trainer's requests in flight; public turns wait until there are none. Thread-safe."""

    def __init__(self) -> None:
        self._idle = threading.Condition()
        self._running = 0

    @contextmanager
    def trainer(self) -> Iterator[None]:
        """Hold the gate closed to public play for the duration of a trainer request."""
        with self._idle:
            self._running += 1
        try:
            yield
        finally:
            with self._idle:
                self._running -= 1
                if not self._running:
                    self._idle.notify_all()

    def wait_turn(self) -> None:
        """Block until no trainer request is running (public play calls this before every turn)."""
        with self._idle:
            self._idle.wait_for(lambda: self._running == 0)


class BehindTrainer:
    """An engine as public play sees it: each ``generate`` first waits for the trainer's requests.
    Everything else is the engine's own."""

    def __init__(self, engine: Engine, gate: TrainerFirst) -> None:
        self._engine = engine
        self._gate = gate

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams | None = None, *, at: int | None = None
    ) -> list[Completion]:
        self._gate.wait_turn()
        return self._engine.generate(prompts, params, at=at)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)
