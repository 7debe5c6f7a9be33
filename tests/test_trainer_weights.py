"""The trainer's fp32 master weights, the published state that is their cast to the checkpoint's dtypes, and what a
restarted trainer resumes from the bucket."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import delta
from tests._trainer_stack import tiny_model
from trainer_space.weights import cast_into, checkpoint_dtypes, master_tensors, published_state, pull_into


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("model")))


def test_published_state_has_the_checkpoints_names_and_dtypes_and_its_bits(folder: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    master = master_tensors(model, folder)
    published = published_state(master, folder)
    stored = delta.load_state(folder)
    assert list(published) == sorted(stored) == list(checkpoint_dtypes(folder))
    assert all(t.dtype == torch.float32 for t in master.values())
    for name, tensor in published.items():
        assert tensor.dtype == stored[name].dtype == checkpoint_dtypes(folder)[name]
        assert torch.equal(tensor, stored[name])  # the fp32 load of a bf16 file casts back exactly
        assert tensor.data_ptr() != master[name].data_ptr()  # its own storage: the optimizer cannot touch it


def test_updates_below_half_an_ulp_add_up_in_the_master_weights(folder: str) -> None:
    """The reason for master weights: bf16 parameters would drop each of these updates."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    master = master_tensors(model, folder)
    published = published_state(master, folder)
    name = next(n for n, t in published.items() if t.dtype == torch.bfloat16 and t.numel() > 1000)
    before = published[name].clone()
    mantissa, exponent = torch.frexp(before.float())  # |mantissa| in [0.5, 1): one bf16 ULP is 2**(exponent - 8)
    inside = mantissa.abs() > 0.5  # not zero, not a power of two (whose ULP below is half the one above)
    step = torch.where(inside, torch.ldexp(torch.full_like(mantissa, 0.3), exponent - 8), 0.0)
    assert inside.float().mean() > 0.9
    with torch.no_grad():
        master[name].add_(step)  # alone, each update rounds back to the same bf16 value
    cast_into(published, master)
    assert torch.equal(published[name], before)
    assert torch.equal(before.float().add(step).bfloat16(), before), "bf16 weights would keep nothing either way"
    with torch.no_grad():
        for _ in range(3):
            master[name].add_(step)
    cast_into(published, master)
    moved = published[name] != before
    assert torch.equal(moved, inside), "updates summing to 1.2 ULP must move every element they touched"
    assert torch.equal(published[name], master[name].bfloat16())


def test_a_restarted_trainer_resumes_its_own_last_version_not_a_strangers_after_it(
        folder: str, tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """A version someone else signed, committed after the trainer's own: the trainer says so and resumes its own."""
    from dataclasses import replace

    from delta.bucket.manifest import write_manifest
    from delta.bucket.trust import sign_latest

    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(folder)
    v1 = {n: t + 1 if t.is_floating_point() else t for n, t in v0.items()}
    with delta.Publisher(bucket) as pub:
        for s in (v0, v1):
            pub.publish(s)
            assert pub.flush(60)
    storage = delta.Bucket.open(bucket)
    ours = delta.read_manifest(storage)
    theirs = ours.with_version(replace(ours.latest, version=3, base_version=2, base_hash=ours.latest.state_hash))
    write_manifest(storage, sign_latest(theirs, delta.SigningKey.generate(), ours.latest.run))
    state = {n: t.clone() for n, t in v0.items()}
    trainers = delta.Bucket.open(bucket, writer=True)  # the trainer's, as its composition root opens it
    assert trainers.resume().version == 2
    assert pull_into(state, trainers, 2) == ours.latest.state_hash
    assert all(torch.equal(state[n].view(torch.uint8), v1[n].view(torch.uint8)) for n in v1)
    assert "versions 3..3 of file://" in caplog.text and "not signed by this trainer's key (SHA256:" in caplog.text
