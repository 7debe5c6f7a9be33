"""`BucketWeightTransfer`, driven as TRL AsyncGRPO drives its `weight_transfer=`, publishes every synced
step of a real training run, and a Subscriber reproduces each version bit for bit."""

from __future__ import annotations

import inspect
import queue
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen3ForCausalLM

import delta
from delta.integrations.trl import BucketWeightTransfer
from models import build_tiny_qwen3

REPO = Path(__file__).resolve().parent.parent
#: The three lines docs/delta.md (the package's README) gives a TRL user.
THREE_LINES = (
    "from delta.integrations.trl import BucketWeightTransfer",
    'transfer = BucketWeightTransfer("s3://bucket/run", dtype=torch.bfloat16)',
    "trainer = AsyncGRPOTrainer(..., weight_transfer=transfer)",
)


def streamed(model: torch.nn.Module):
    """What AsyncGRPO's `_streaming_iter` yields: trainable parameters by name, detached (no FSDP here)."""
    for name, param in model.named_parameters():
        if param.requires_grad:
            yield name, param.detach()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(width), b.view(width))


def test_the_protocol_is_trls() -> None:
    protocol = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer").WeightTransferProtocol
    methods = [m for m in dir(protocol) if not m.startswith("_")]
    assert methods == ["destroy", "init_weight_transfer", "pause", "resume", "send_weights"]
    for method in methods:
        ours, theirs = inspect.signature(getattr(BucketWeightTransfer, method)), inspect.signature(getattr(protocol, method))
        assert list(ours.parameters) == list(theirs.parameters), method


def test_adamw_steps_published_as_asyncgrpo_syncs_them_are_reproduced_bit_for_bit(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Qwen3ForCausalLM.from_pretrained(build_tiny_qwen3(str(tmp_path / "model")), dtype=torch.float32)
    model.model.layers[0].mlp.up_proj.weight.requires_grad_(False)  # frozen: AsyncGRPO does not stream it
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    bucket = str(tmp_path / "bucket")
    transfer = BucketWeightTransfer(bucket, delta.PublisherConfig(anchor_every=3), dtype=torch.bfloat16, wait=True)

    transfer.init_weight_transfer()  # AsyncGRPO: on train begin, then a first (cold) sync
    expected: dict[int, dict[str, torch.Tensor]] = {}
    for step in range(6):
        if step:  # one optimizer step between syncs
            ids = torch.randint(0, model.config.vocab_size, (2, 16))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        transfer.pause()
        transfer.send_weights(streamed(model))
        transfer.resume()
        expected[transfer.version] = {n: p.to(torch.bfloat16) for n, p in streamed(model)}
    transfer.destroy()

    assert sorted(expected) == [1, 2, 3, 4, 5, 6]
    assert "model.layers.0.mlp.up_proj.weight" not in expected[1]
    for version in range(1, 7):
        changed = sum(not bits_equal(expected[version][n], expected[max(1, version - 1)][n]) for n in expected[1])
        assert changed > 0 or version == 1  # each step moved some bf16 weights
        with delta.Subscriber(bucket) as reader:  # a fresh reader per version: anchor + deltas to it
            assert reader.sync(version) == version
            assert sorted(reader.state) == sorted(expected[version])
            assert all(bits_equal(reader.state[n], expected[version][n]) for n in expected[version])
    log = delta.Subscriber(bucket)
    assert log.sync() == 6
    log.close()


FLOATS = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True, width=32)


@settings(max_examples=25, deadline=None)
@given(steps=st.lists(st.lists(FLOATS, min_size=12, max_size=12), min_size=1, max_size=4))
def test_any_float32_values_cast_and_round_trip_bit_for_bit(tmp_path_factory, steps: list[list[float]]) -> None:
    """NaN payloads, -0, infinities and subnormals survive the cast to bf16 and the bucket, step after step."""
    bucket = str(tmp_path_factory.mktemp("bucket"))
    transfer = BucketWeightTransfer(bucket, dtype=torch.bfloat16, wait=True)
    transfer.init_weight_transfer()
    published = []
    for values in steps:
        weight = torch.tensor(values, dtype=torch.float32).reshape(3, 4)
        transfer.send_weights(iter([("w", weight), ("b", -weight[0])]))
        published.append({"w": weight.to(torch.bfloat16), "b": (-weight[0]).to(torch.bfloat16)})
    transfer.destroy()
    with delta.Subscriber(bucket) as reader:
        for version, state in enumerate(published, start=1):
            reader.sync(version)
            assert all(bits_equal(reader.state[n], state[n]) for n in state)


def test_a_call_that_streams_other_tensors_is_refused_and_publishes_nothing(tmp_path: Path) -> None:
    transfer = BucketWeightTransfer(str(tmp_path / "bucket"), wait=True)
    transfer.send_weights(iter([("w", torch.zeros(4)), ("b", torch.ones(2))]))
    with pytest.raises(ValueError, match=r"streamed 'w' \(5,\), which the published state does not hold"):
        transfer.send_weights(iter([("w", torch.zeros(5)), ("b", torch.ones(2))]))
    with pytest.raises(ValueError, match=r"did not stream \['b'\]"):
        transfer.send_weights(iter([("w", torch.ones(4))]))
    assert transfer.version == 1
    transfer.destroy()


def asyncgrpo_sync(model: torch.nn.Module, transfer: BucketWeightTransfer) -> None:
    """One weight sync of a PEFT model as AsyncGRPO makes it with a `weight_transfer=` (`_sync_weight_merged`):
    the adapter merged into the base, TRL's own stream of base weights sent, the adapter unmerged."""
    trainer = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer")
    model.merge_adapter()
    try:
        transfer.send_weights((name, p.detach()) for name, p in trainer._iter_vllm_named_params(model))
    finally:
        model.unmerge_adapter()


def lora_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("sync", ["adapter", "merged"])
def test_a_peft_model_under_asyncgrpo_publishes_peft_s_adapter_or_merged_weights(tmp_path: Path, sync: str) -> None:
    """Adapter mode: each version is the adapter file PEFT saves (`save_pretrained`), bit for bit. Merged mode:
    each version is PEFT's merged model (`merge_and_unload`) in bf16, under the checkpoint's names."""
    import copy

    from safetensors.torch import load_file

    from tests._lora import peft_model, settings

    folder = build_tiny_qwen3(str(tmp_path / "model"))
    policy = peft_model(folder, settings(folder, sync)).train()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=1e-2)
    bucket = str(tmp_path / "bucket")
    transfer = (BucketWeightTransfer(bucket, adapter_of=policy, wait=True) if sync == "adapter"
                else BucketWeightTransfer(bucket, dtype=torch.bfloat16, wait=True))
    expected = {}
    for step in range(3):
        if step:
            lora_steps(policy, optimizer, step)
        asyncgrpo_sync(policy, transfer)
        if sync == "adapter":
            policy.save_pretrained(str(tmp_path / f"v{transfer.version}"))
            expected[transfer.version] = load_file(str(tmp_path / f"v{transfer.version}" / "adapter_model.safetensors"))
        else:
            merged = copy.deepcopy(policy).merge_and_unload()
            expected[transfer.version] = {n: p.detach().to(torch.bfloat16) for n, p in merged.named_parameters()}
    transfer.destroy()

    assert sorted(expected) == [1, 2, 3]
    names = set(delta.load_state(folder)) if sync == "merged" else {n for n in expected[1] if ".lora_" in n}
    with delta.Subscriber(bucket) as reader:
        for version, state in expected.items():
            assert reader.sync(version) == version
            assert set(reader.state) == set(state) == names
            assert all(bits_equal(reader.state[n], state[n]) for n in state), version
    assert not all(bits_equal(expected[1][n], expected[3][n]) for n in names)  # the steps moved what is published


def test_adapter_of_must_be_a_peft_model(tmp_path: Path) -> None:
    transfer = BucketWeightTransfer(str(tmp_path / "bucket"), adapter_of=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"adapter_of is a Linear, not a PEFT model"):
        transfer.send_weights(iter([("w", torch.zeros(2))]))
    assert transfer.version is None
    transfer.destroy()


class IdleWorker:
    """AsyncGRPO's `rollout_worker=` that plays nothing (no vLLM server to sample from here): records the versions
    AsyncGRPO tells it."""

    def __init__(self) -> None:
        self.rollout_buffer, self.metrics_queue, self.versions = queue.Queue(), queue.Queue(), []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def update_model_version(self, model_version: int) -> None:
        self.versions.append(model_version)

    def check_health(self, stale_after_s: float) -> None:
        pass


def test_the_docs_three_lines_publish_what_asyncgrpo_itself_syncs(tmp_path: Path, monkeypatch) -> None:
    """docs/delta.md's three lines with AsyncGRPO itself (a tiny model, a local bucket for s3://bucket/run): its
    train-begin callback and its own `_sync_weight` publish through the transfer, and a Subscriber reads back what it
    streamed, in bf16, bit for bit. Built on a CPU, where AsyncGRPO's constructor asks CUDA for the device's peak FLOPs
    (a throughput metric; answered here); its training needs a GPU (FlashAttention), so the step between the two
    syncs is ours."""
    async_grpo = pytest.importorskip("trl.experimental.async_grpo.async_grpo_trainer")
    from datasets import Dataset
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    docs = (REPO / "docs" / "delta.md").read_text()
    assert all(line in docs for line in THREE_LINES)
    monkeypatch.setattr(async_grpo, "get_peak_flops_per_device", lambda *_: 1.0)
    folder, bucket = build_tiny_qwen3(str(tmp_path / "model")), str(tmp_path / "bucket")

    transfer = BucketWeightTransfer(bucket, dtype=torch.bfloat16)
    trainer = AsyncGRPOTrainer(model=folder, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                               args=AsyncGRPOConfig(str(tmp_path / "out"), report_to="none", use_cpu=True),
                               train_dataset=Dataset.from_dict({"prompt": ["hi"]}), rollout_worker=IdleWorker(),
                               weight_transfer=transfer)

    def streamed_bf16() -> dict[str, torch.Tensor]:
        return {n: p.detach().to(torch.bfloat16) for n, p in async_grpo._iter_vllm_named_params(trainer.model)}

    begin = next(c for c in trainer.callback_handler.callbacks if isinstance(c, async_grpo._TrainBeginCallback))
    begin.on_train_begin(trainer.args, trainer.state, trainer.control)  # init + the cold sync
    expected = {1: streamed_bf16()}
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(torch.sign(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))) * 1e-2)
    trainer._sync_weight()  # what AsyncGRPO calls every weight_sync_steps
    expected[2] = streamed_bf16()
    transfer.destroy()

    assert trainer.model_version == 2 and trainer.rollout_worker.versions == [1, 2]
    with delta.Subscriber(bucket) as reader:
        for version, state in expected.items():
            assert reader.sync(version) == version
            assert set(reader.state) == set(state) and all(bits_equal(reader.state[n], state[n]) for n in state)
    assert not all(bits_equal(expected[1][n], expected[2][n]) for n in expected[1])
