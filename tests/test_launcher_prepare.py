"""launcher.prepare: what the launcher says before it prepares the model."""

from __future__ import annotations

import os

import models.smollm2
from launcher.prepare import preparing_text
from models import DEFAULT_MODEL


def test_the_launcher_says_it_converts_the_model_only_when_it_still_has_to(tmp_path, monkeypatch) -> None:
    """It said "preparing the model (once; later starts reuse it)" at every start, the folder converted long before."""
    monkeypatch.setattr(models.smollm2, "CACHE_DIR", str(tmp_path))
    assert preparing_text(DEFAULT_MODEL).endswith(": converting it once (~40 s on 2 cores; later starts reuse it)")
    os.makedirs(models.smollm2.smollm2_folder())
    assert preparing_text(DEFAULT_MODEL) == (f"model {DEFAULT_MODEL}: converted on an earlier start, in "
                                             f"{models.smollm2.smollm2_folder()}")
    assert preparing_text(str(tmp_path)) == f"model {tmp_path}: a folder, used as it is"
    assert preparing_text("Qwen/Qwen3-0.6B").startswith("getting the model Qwen/Qwen3-0.6B")
