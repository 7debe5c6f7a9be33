"""What a LoRA run publishes (trainer_space/lora.py): the adapter under PEFT's names, or the merged weights under the
checkpoint's; and the settings and flags that ask for one."""

from __future__ import annotations

import argparse
import threading

import pytest
import torch

import delta
from tests._lora import peft_model, settings
from tests._trainer_stack import tiny_model
from trainer_space import TrainerConfig
from trainer_space.launch import add_arguments, config_from_args
from trainer_space.lora import MergedWeights, adapter_tensors, lora_master, lora_settings
from trainer_space.weights import published_state
from wire.lora import DEFAULT_TARGETS


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("tiny")))


def test_the_adapter_is_peft_s_saved_tensors_sharing_the_parameters(model: str) -> None:
    from peft import get_peft_model_state_dict

    wrapped = peft_model(model, settings(model))
    adapter = adapter_tensors(wrapped)
    saved = get_peft_model_state_dict(wrapped)
    assert list(adapter) == sorted(saved) and all(torch.equal(adapter[n], saved[n]) for n in saved)
    assert len(adapter) == 2 * 7 * 2  # A and B of 7 projections in each of the 2 layers
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    param = dict(wrapped.named_parameters())[name.replace(".lora_B.", ".lora_B.default.")]
    assert adapter[name].data_ptr() == param.data_ptr()  # the master weights: the optimizer's updates show
    assert lora_master(wrapped, model, "adapter").keys() == adapter.keys()


def test_the_merged_weights_are_peft_s_merge_under_the_checkpoint_s_names(model: str) -> None:
    wrapped = peft_model(model, settings(model, "merged"))
    merged = lora_master(wrapped, model, "merged")
    assert isinstance(merged, MergedWeights) and list(merged) == sorted(delta.load_state(model))
    values = {n: merged[n].clone() for n in merged}
    reference = wrapped.merge_and_unload().state_dict()  # PEFT's own merge (modifies the model: last)
    assert all(torch.equal(values[n], reference[n]) for n in values)
    published = published_state(values, model)
    assert {t.dtype for t in published.values()} == {torch.bfloat16}  # the checkpoint's dtype, what servers load


def test_the_run_s_lora_settings_name_the_base_by_its_hash(model: str) -> None:
    config = TrainerConfig("b", None, model, lora_r=8, lora_sync="adapter")
    lora = lora_settings(config, "sum128:" + "0" * 32)
    assert (lora.sync, lora.r, lora.alpha, lora.targets, lora.base_model) == ("adapter", 8, 16.0, DEFAULT_TARGETS, model)


@pytest.mark.parametrize("bad, match", [
    ({"lora_r": -1}, "lora_r must be 0"), ({"lora_r": 4, "lora_sync": "both"}, "lora_sync must be one of"),
    ({"lora_r": 4, "lora_alpha": 0.0}, "lora_alpha must be positive"), ({"lora_r": 4, "lora_targets": ()}, "lora_targets"),
    ({"lora_r": 513, "lora_sync": "adapter"}, r"^--lora-r 513 with --lora-sync adapter: no rollout engine serves an "
                                              r"adapter above rank 512; lower --lora-r, or use --lora-sync merged$"),
    ({"lora_r": 4, "lora_sync": "adapter", "max_staleness": 16},
     r"^the run asks every server to keep 17 adapter versions loaded \(its max_staleness \+ 1\), above the cap of 16: "
     r"run the trainer with --max-staleness 15 or less, or --lora-sync merged$"),
])
def test_bad_lora_settings_say_what_to_change(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TrainerConfig("b", None, "m", **bad)


def test_the_caps_of_an_adapter_run_are_what_its_servers_hold() -> None:
    """Rank 512 and staleness 15 pass in adapter mode; merged runs load no adapter on the servers: no such caps."""
    import settings
    from wire.lora import MAX_ADAPTER_RANK

    assert MAX_ADAPTER_RANK == settings.VLLM_LORA_RANKS[-1]  # vLLM's largest
    TrainerConfig("b", None, "m", lora_r=512, lora_sync="adapter", max_staleness=15)
    TrainerConfig("b", None, "m", lora_r=1024, lora_sync="merged", max_staleness=100)


def test_a_lora_run_needs_the_fleet() -> None:
    with pytest.raises(ValueError, match="a LoRA run needs the fleet .*: leave --rollout-url unset"):
        TrainerConfig("b", "http://rollout", "m", lora_r=4)
    assert not TrainerConfig("b", "http://rollout", "m").lora  # no adapter by default


def test_the_flags_ask_for_an_adapter(model: str) -> None:
    from models.hardware import Machine

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--bucket", "b", "--lora-r", "16", "--lora-alpha", "8", "--lora-targets", "q_proj, v_proj",
                              "--lora-sync", "adapter", "--device", "cpu"])
    config = config_from_args(args, model, Machine.probe())
    assert (config.lora_r, config.lora_alpha, config.lora_targets, config.lora_sync) == (16, 8.0, ("q_proj", "v_proj"),
                                                                                         "adapter")
    defaults = config_from_args(parser.parse_args(["--bucket", "b", "--device", "cpu"]), model, Machine.probe())
    assert (defaults.lora_r, defaults.lora_targets, defaults.lora_sync) == (0, DEFAULT_TARGETS, "merged")


def _parts(bucket: str, model: str, previous=None, **changes):
    """TrainerParts of a LoRA run on `bucket`, after a run whose LoRA settings were `previous` (None: no run.json)."""
    from trainer_space.fleet import FleetRun
    from trainer_space.parts import load_parts
    from trainer_space.ranks import TrainerRanks
    from wire.fleet import RunState
    from fleet.bucket import FleetBucket

    config = TrainerConfig(bucket, None, model, **{"lora_r": 4, "lora_sync": "adapter", **changes})
    writer = delta.Bucket.open(bucket, writer=True)
    fleet_bucket = FleetBucket(writer)
    if previous is not None:
        before = FleetRun(config, fleet_bucket, run_id="before")
        before.know_lora(previous)
        before.send(RunState.STOPPED, 1)
    now = FleetRun(config, fleet_bucket, run_id="now")
    now.read_previous()
    return load_parts(config, writer, ranks=TrainerRanks(), fleet=now, client=None, stop=threading.Event())


def _publish_adapter(bucket: str, model: str) -> dict[str, torch.Tensor]:
    adapter = {n: t.clone() for n, t in adapter_tensors(peft_model(model, settings(model))).items()}
    with delta.Publisher(bucket) as publisher:
        publisher.publish(adapter)
        publisher.flush()
    return adapter


def test_an_adapter_run_resumes_the_bucket_s_adapter_bit_for_bit(model: str, tmp_path) -> None:
    from peft import get_peft_model

    bucket = str(tmp_path / "bucket")
    stored = _publish_adapter(bucket, model)
    parts = _parts(bucket, model, previous=settings(model))
    try:
        manifest = delta.read_manifest(delta.Bucket.open(bucket))
        assert (parts.resumed_from, parts.resumed_hash) == (1, manifest.latest.state_hash)
        assert parts.callback.version == 1 and parts.publisher.state_version == 1
        wrapped = get_peft_model(parts.model, parts.lora.peft_config())  # as TRL does when the first run begins
        master = parts.callback.master_of(wrapped)
        assert all(torch.equal(master[n], stored[n]) for n in stored)  # the PEFT model holds the stored adapter
        assert delta.state_digest(master).hexdigest == manifest.latest.state_hash
    finally:
        parts.close(10)


@pytest.mark.parametrize("previous, changes, match", [
    (None, {}, "holds version 1 and no LoRA run's settings beside it: a LoRA run resumes only an adapter"),
    ("same", {"lora_sync": "merged"}, r"holds version 1: a merged LoRA run starts on an empty bucket \(resuming one is "
                                      r"not built: .*\); start it with a new --bucket, and train with --lora-sync adapter "
                                      "where a run must resume$"),
    ("same", {"lora_r": 8}, r"written by a LoRA run of other settings: r 4 \(this run: 8\), alpha 8.0 \(this run: 16.0\)"),
    ("other base", {}, "written by a LoRA run of other settings: base 'sum128:0+' "),
])
def test_a_lora_run_refuses_a_bucket_it_cannot_resume(model: str, tmp_path, previous, changes, match) -> None:
    bucket = str(tmp_path / "bucket")
    _publish_adapter(bucket, model)
    before = {None: None, "same": settings(model), "other base": settings(model, base_hash="sum128:" + "0" * 32)}
    with pytest.raises(ValueError, match=match):
        _parts(bucket, model, previous=before[previous], **changes)


def test_a_lora_run_is_not_announced_as_running_before_its_base_is_known(tmp_path) -> None:
    from trainer_space.fleet import FleetRun
    from wire.fleet import RunState
    from fleet.bucket import FleetBucket

    bucket = FleetBucket(str(tmp_path / "b"))
    run = FleetRun(TrainerConfig(bucket.bucket.url, None, "m", lora_r=4), bucket, run_id="r")
    run.send(RunState.RUNNING, 0)
    assert bucket.read_run().state == RunState.PAUSED and bucket.read_run().lora is None
    run.know_lora(lora_settings(run.config, "sum128:" + "0" * 32))  # the model loaded: written again, running
    assert bucket.read_run().state == RunState.RUNNING and bucket.read_run().lora.r == 4


@pytest.mark.parametrize("targets, match", [
    (("q_proj", "v_prj"), r"^--lora-targets v_prj matches no module of the model; its linear layers are: down_proj, "
                          r"gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj$"),
    (("embed_tokens",), r"^--lora-targets embed_tokens names model.embed_tokens, a Embedding: an adapter is built on "
                        r"linear layers only \(down_proj, "),
    (("self_attn",), r"^--lora-targets self_attn names model.layers.0.self_attn, a Qwen3Attention: "),
])
def test_a_lora_run_refuses_targets_that_are_not_linear_layers_before_training(model: str, tmp_path, targets,
                                                                                match) -> None:
    from trainer_space.lora import LoraRefusedError

    with pytest.raises(LoraRefusedError, match=match):
        _parts(str(tmp_path / "bucket"), model, lora_targets=targets)


def test_target_names_are_checked_with_the_flags() -> None:
    with pytest.raises(ValueError, match=r"target module name 'q proj' must be 1 to 128 letters"):
        TrainerConfig("b", None, "m", lora_r=4, lora_targets=("q proj",))
    with pytest.raises(ValueError, match=r"target modules repeat a name: \('q_proj', 'q_proj'\)"):
        TrainerConfig("b", None, "m", lora_r=4, lora_targets=("q_proj", "q_proj"))


def test_a_session_with_targets_it_cannot_honour_stops_at_start_with_one_line(model: str, tmp_path, caplog) -> None:
    from tests._trainer_stack import wait_until
    from trainer_space import build_session
    from wire.fleet import RunState
    from fleet.bucket import FleetBucket

    session = build_session(TrainerConfig(str(tmp_path / "bucket"), None, model, lora_r=4, lora_targets=("qproj",)))
    try:
        session.start()
        status = wait_until(lambda: (s := session.status()).error and s.state == "stopped" and s, 120, "the refusal")
    finally:
        session.close()
    assert status.error.startswith("LoraRefusedError: --lora-targets qproj matches no module of the model; ")
    assert "\n" not in status.error and status.version == 0
    [record] = [r for r in caplog.records if "training stopped" in r.getMessage()]
    assert record.exc_info is None  # a setting to change: no traceback in the log
    run = FleetBucket(str(tmp_path / "bucket")).read_run()
    assert run is None or run.state != RunState.RUNNING  # never announced as running


def test_a_run_of_every_weight_refuses_a_bucket_of_adapter_versions_in_one_line(model: str, tmp_path) -> None:
    from trainer_space.lora import LoraRefusedError

    bucket = str(tmp_path / "bucket")
    _publish_adapter(bucket, model)
    with pytest.raises(LoraRefusedError, match=r"^bucket .* holds the versions of a LoRA adapter run \(r 4, adapter "
                                                r"mode\), which a run of every weight cannot resume; use a new bucket"):
        _parts(bucket, model, previous=settings(model), lora_r=0)
