"""A LoRA run's settings as the run's settings carry them: checked fields, one round trip through the envelope."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wire.fleet import RunSettings, decode, encode
from wire.lora import DEFAULT_TARGETS, LoraSettings

GOOD = dict(sync="adapter", r=16, alpha=32.0, targets=DEFAULT_TARGETS, base_model="/models/smollm2",
            base_hash="sum128:" + "ab" * 16)


def test_the_default_targets_are_every_attention_and_mlp_projection() -> None:
    assert DEFAULT_TARGETS == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    config = LoraSettings(**GOOD).peft_config()
    assert (config.r, config.lora_alpha, set(config.target_modules)) == (16, 32.0, set(DEFAULT_TARGETS))
    assert (config.lora_dropout, config.bias) == (0.0, "none")


@pytest.mark.parametrize("bad", [{"sync": "both"}, {"r": 0}, {"r": 4096}, {"alpha": 0}, {"targets": ()},
                                 {"targets": ("q_proj", "q_proj")}, {"targets": ("q_proj/../x",)},
                                 {"base_hash": "not a hash"}, {"extra": 1}])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        LoraSettings(**{**GOOD, **bad})


def test_the_run_s_settings_carry_them_through_the_bucket_s_envelope() -> None:
    from tests.test_wire_fleet import run_settings as settings

    run = RunSettings.model_validate({**settings().model_dump(), "lora": GOOD})
    assert decode(encode(run), RunSettings).lora == LoraSettings(**GOOD)
    assert settings().lora is None  # a run that trains every weight
