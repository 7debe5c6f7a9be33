"""`bench.lora` runs end to end on the tiny model (2 steps, well under a minute) and its figures hold together."""

from __future__ import annotations

import json
from pathlib import Path

from bench.lora import main
from tests._trainer_stack import tiny_model


def test_two_steps_on_the_tiny_model_report_both_modes(tmp_path: Path, capsys) -> None:
    model, out = tiny_model(str(tmp_path / "model")), tmp_path / "lora.json"
    figures = main(["--model", model, "--steps", "2", "--rank", "4", "--gen-tokens", "4", "--poll-interval", "0.05",
                    "--json", str(out)])
    assert json.loads(out.read_text()) == figures
    assert [v["version"] for v in figures["versions"]] == [2, 3]
    for v in figures["versions"]:
        # The adapter's float32 tensors all move under AdamW; the merged bf16 weights only where rounding lets them.
        assert v["changed"]["adapter"] == 1.0 and 0 < v["changed"]["merged"] < 1
        assert 0 < v["delta_bytes"]["adapter"] < figures["adapter_file_bytes"]
        assert 0 < v["delta_bytes"]["merged"] < figures["model_file_bytes"]
        assert v["serve_s"]["adapter"] > 0 and v["serve_s"]["merged"] > 0  # measured, printed: not bounded here
    assert figures["adapter_params"] < figures["model_params"]
    assert all(rate > 0 for mode in ("adapter", "merged") for rate in figures["tokens_per_s"][mode].values())
    printed = capsys.readouterr().out
    assert printed.startswith("measured on: ") and "tokens per CPU s: adapter served as LoRA (PEFT, unmerged)" in printed


def test_the_vllm_engine_is_skipped_with_a_reason_where_vllm_is_missing(capsys, monkeypatch) -> None:
    import importlib.util

    from bench.lora import _engine_options, _vllm_skip

    assert _vllm_skip("transformers") is None and _engine_options("transformers", 16) == {}
    assert _engine_options("vllm", 16) == {"max_lora_rank": 16} and _engine_options("vllm", 12) == {"max_lora_rank": 16}
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["--engine", "vllm"]) == {"skipped": "vLLM is not installed"}
    assert "--engine vllm: skipped, vLLM is not installed" in capsys.readouterr().out
