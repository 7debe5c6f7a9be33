"""The errors an engine raises."""

from __future__ import annotations


class EngineError(RuntimeError):
    """The engine failed to do what was asked (closed, or its backend broke).

    Attributes:
        version: The version the engine was serving when it failed.
    """

    def __init__(self, message: str, *, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


class PromptError(ValueError):
    """A prompt the engine cannot take (empty, token ids outside the vocabulary, or too long for
    `max_model_len` with the tokens asked for); nothing was generated."""


class UpdateRefusedError(ValueError):
    """An update was refused before anything was changed: the engine still serves its previous version.

    Raised for tensors the model does not have, or whose shape or dtype differ from the published
    state the engine holds.

    Attributes:
        version: The version the update would have moved to.
        serving: The version the engine still serves.
        problems: One line per offending tensor.
    """

    def __init__(self, version: int, serving: int, problems: list[str]) -> None:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        super().__init__(
            f"update to version {version} refused, still serving version {serving}: {shown}. An update carries "
            "tensors of the published state the engine was loaded with (same names, shapes, dtypes); to serve "
            "another architecture, start an engine on that model"
        )
        self.version = version
        self.serving = serving
        self.problems = problems
