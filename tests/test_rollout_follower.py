"""An engine following a real local bucket: versions applied, errors visible, last good version kept."""

from __future__ import annotations

import os
import time

import pytest

from delta import SubscriberConfig, read_manifest
import delta
from rollout_space.engines import EngineConfig, SamplingParams, open_engine
from rollout_space.follower import Follower
from tests._engines import build_model, step

FAST = SubscriberConfig(poll_interval=0.05, max_backoff=0.2)


@pytest.fixture()
def model(tmp_path):
    return build_model(str(tmp_path / "model"), seed=1)


def _publish(bucket: str, states: list[dict]) -> None:
    with delta.Publisher(bucket) as publisher:
        for state in states:
            publisher.publish(state)
            publisher.flush()


def _wait(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_serves_each_published_version_bit_identical_to_the_trainer(tmp_path, model):
    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    names = sorted(v0)
    states = [v0]
    for i in range(3):
        states.append(step(states[-1], names[i::2], seed=i))
    _publish(bucket, states[:1])  # the trainer's version 1 is the model the rollout loads
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        assert engine.version == 1  # recognised by its hash: no anchor fetched
        follower.start()
        try:
            _publish(bucket, states[1:])
            _wait(lambda: engine.version == 4)
            manifest = read_manifest(delta.Bucket.open(bucket))
            assert delta.state_digest(engine.state).hexdigest == manifest.get(4).state_hash
            records = follower.records()
            assert [r.version for r in records][-1] == 4 and all(r.via == "delta" for r in records)
            last = records[-1]
            assert last.bytes_fetched > 0 and last.pause_s >= 0 and last.lag_s is not None and last.lag_s >= 0
            assert 0 <= last.wait_s <= last.lag_s  # the wait for the batch in flight is part of the lag
            header = follower.last_header()
            assert header is not None and header.version == 4
            # The tensors version 4 stepped (norms at 1.0 round back in bf16, so not all of them).
            changed = {t.name for t in header.tensors if t.changed}
            assert changed and changed <= set(names[2::2])
            status = follower.status()
            assert status.pop("trust").startswith("trainer key SHA256:")  # trusted on first use: no key was given
            assert status == {"latest_version": 4, "lag": 0, "failures": 0, "last_error": None, "refused": {},
                              "last_refusal": None, "authenticated": True, "state_hash": manifest.get(4).state_hash}
            # What it computes is the published state: same greedy output as an engine loaded from it.
            prompt = [[5, 6, 7, 8]]
            params = SamplingParams(max_tokens=6, temperature=0)
            served = engine.generate(prompt, params)[0]
            assert served.version == 4
            fresh_folder = tmp_path / "fresh"
            _save_as_model(model, states[-1], str(fresh_folder))
            with open_engine("transformers", EngineConfig(str(fresh_folder))) as fresh:
                assert fresh.generate(prompt, params)[0].token_ids == served.token_ids
        finally:
            follower.close()


def test_a_corrupt_version_leaves_the_last_good_one_served_with_the_error_shown(tmp_path, model):
    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    v1 = step(v0, sorted(v0)[:3], seed=5)
    _publish(bucket, [v0, v1])
    manifest = read_manifest(delta.Bucket.open(bucket))
    [ref] = manifest.get(2).delta
    path = os.path.join(bucket, ref.path)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with open_engine("transformers", EngineConfig(model)) as engine:
        before = {n: t.clone() for n, t in engine.state.items()}
        follower = Follower(engine, bucket, FAST)
        assert engine.version == 1
        with pytest.raises(delta.DeltaError):
            follower.sync()
        assert engine.version == 1
        assert all(delta.state_digest({n: engine.state[n]}) == delta.state_digest({n: before[n]}) for n in before)
        assert ref.path in follower.status()["last_error"]
        assert follower.status()["latest_version"] == 2 and follower.status()["lag"] == 1
        assert engine.generate([[5, 6]], SamplingParams(max_tokens=2, temperature=0))[0].version == 1
        follower.close()


def test_an_empty_bucket_serves_the_model_as_given(tmp_path, model):
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, str(tmp_path / "empty"), FAST)
        assert follower.sync() is None
        assert engine.version == 0
        assert follower.status() == {
            "latest_version": None, "lag": None, "failures": 0, "last_error": None, "refused": {}, "last_refusal": None,
            "trust": "no key yet: the first signed version's is trusted (trust on first use)", "authenticated": True,
            "state_hash": None}
        follower.close()


def test_a_model_unknown_to_the_bucket_is_replaced_by_the_bucket_state(tmp_path, model):
    other = build_model(str(tmp_path / "other"), seed=2)
    bucket = str(tmp_path / "bucket")
    trainer = delta.load_state(other)
    _publish(bucket, [trainer, step(trainer, sorted(trainer)[:2], seed=1)])
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        assert engine.version == 0
        assert follower.sync() == 2 and engine.version == 2
        assert [r.via for r in follower.records()] == ["anchor", "delta"]
        manifest = read_manifest(delta.Bucket.open(bucket))
        assert delta.state_digest(engine.state).hexdigest == manifest.get(2).state_hash
        follower.close()


def _save_as_model(template: str, state: dict, folder: str) -> None:
    """A model folder like `template` holding `state`'s weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(template, dtype="auto")
    model.load_state_dict(state, strict=False)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(template).save_pretrained(folder)


def test_versions_that_arrive_during_a_batch_are_served_together_right_after_it(tmp_path, model):
    """The subscriber keeps decoding while the engine is busy; the engine then jumps to the newest
    version in one load (not one batch per version, which falls behind whenever versions come faster)."""
    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    names = sorted(v0)
    states = [v0]
    for i in range(3):
        states.append(step(states[-1], names[i::3], seed=10 + i))
    _publish(bucket, states[:1])
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        follower.start()
        try:
            with engine.paused():  # a batch in flight
                _publish(bucket, states[1:])
                _wait(lambda: follower.decoded_version == 4)
                assert engine.version == 1 and follower.records() == []
            _wait(lambda: engine.version == 4)
            records = follower.records()
            assert [r.version for r in records] == [2, 3, 4]
            assert len({r.at for r in records}) == 1 and len({r.pause_s for r in records}) == 1  # one load
            assert records[0].wait_s >= records[-1].wait_s >= 0
            manifest = read_manifest(delta.Bucket.open(bucket))
            assert delta.state_digest(engine.state).hexdigest == manifest.get(4).state_hash
            # What it computes with is version 4 in every tensor that any of the three versions changed.
            fresh_folder = tmp_path / "fresh"
            _save_as_model(model, states[-1], str(fresh_folder))
            prompt, params = [[5, 6, 7, 8]], SamplingParams(max_tokens=6, temperature=0)
            with open_engine("transformers", EngineConfig(str(fresh_folder))) as fresh:
                assert fresh.generate(prompt, params)[0].token_ids == engine.generate(prompt, params)[0].token_ids
        finally:
            follower.close()


def test_holding_keeps_the_version_served_until_released(tmp_path, model):
    """An exam is of one version: while it holds, new versions are decoded but not loaded; once released they
    load."""
    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    _publish(bucket, [v0])
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        follower.start()
        try:
            with follower.holding():
                _publish(bucket, [v0, step(v0, sorted(v0)[:2], seed=3)])
                _wait(lambda: follower.decoded_version == 3)
                time.sleep(0.3)
                assert engine.version == 1
                engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2, temperature=0))  # serving goes on
                assert engine.version == 1
            _wait(lambda: engine.version == 3)
        finally:
            follower.close()


def test_a_lora_run_is_followed_without_a_restart_and_another_base_is_refused(tmp_path, model):
    import pytest

    from peft import set_peft_model_state_dict

    from rollout_space.errors import LoraRefusedError
    from tests._lora import logprobs, peft_model, settings
    from trainer_space.lora import adapter_tensors

    bucket = str(tmp_path / "bucket")
    lora = settings(model)
    trained = peft_model(model, lora)
    first = {n: t.clone() for n, t in adapter_tensors(trained).items()}
    second = {n: t + 0.01 if ".lora_B." in n and "q_proj" in n else t.clone() for n, t in first.items()}
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        base = dict(engine.state)
        with pytest.raises(LoraRefusedError, match=r"^the run trains a LoRA adapter on base sum128:0+ \(.*\); this "
                                                   r"server's model hashes to sum128:[0-9a-f]+: start it with the run's "
                                                   r"base model$"):
            follower.adopt(settings(model, base_hash="sum128:" + "0" * 32))
        assert follower.lora is None and engine.state.keys() == base.keys()
        # As a vLLM engine without LoRA support: an adapter is refused, the engine unchanged, the refusal counted once
        engine.adapter_refusal = lambda lora: ("no LoRA support", "this engine serves no adapter")
        for _ in range(2):
            with pytest.raises(LoraRefusedError, match="^this engine serves no adapter$"):
                follower.adopt(lora)
        del engine.adapter_refusal
        assert engine.state.keys() == base.keys()
        _publish(bucket, [first, second])
        follower.adopt(lora)
        assert follower.lora == lora and engine.version == 0 and engine.state.keys() == first.keys()
        assert follower.sync() == 2 and engine.version == 2
        manifest = read_manifest(delta.Bucket.open(bucket))
        assert delta.state_digest(engine.state).hexdigest == manifest.get(2).state_hash == follower.status()["state_hash"]
        set_peft_model_state_dict(trained, second)
        ids = [5, 6, 7, 8, 9, 10, 11]
        assert max(abs(a - b) for a, b in zip(engine.prompt_logprobs([ids])[0], logprobs(trained, ids))) < 1e-5
        follower.adopt(lora)  # the same run: nothing to do
        assert engine.version == 2
        assert follower.status()["refused"] == {"another base": 1, "no LoRA support": 1}
        follower.close()


def test_a_run_never_switches_the_kind_of_the_versions_a_server_serves(tmp_path, model):
    """A run's settings that turn a bucket of full weights into an adapter's (its base hash right, as anyone who reads
    the bucket can write it), or the reverse, or change the adapter: refused in one line, counted by reason, the version
    served kept, and the bucket's next version followed as before (never a drop to the base at version 0, then a
    failure at every sync)."""
    from rollout_space.errors import LoraRefusedError
    from tests._lora import peft_model, settings
    from trainer_space.lora import adapter_tensors

    bucket, adapters = str(tmp_path / "bucket"), str(tmp_path / "adapters")
    v0 = delta.load_state(model)
    names = sorted(v0)
    states = [step(v0, names[::3], seed=1), step(v0, names[1::3], seed=2), step(v0, names[2::3], seed=3)]
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        _publish(bucket, states[:2])
        follower.adopt(None, 3)
        assert follower.sync() == 2
        served = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0))[0].token_ids
        forged = settings(model)  # the adapter mode, on the right base
        for _ in range(2):  # read again at every poll: counted once
            with pytest.raises(LoraRefusedError, match=r"^the run now publishes a LoRA adapter of rank 4, alpha 8 on "
                                                       r"q_proj, k_proj, .*, but this server serves version 2 of the "
                                                       r"bucket, which holds full weights: a bucket's versions keep "
                                                       r"their kind, so version 2 stays served \(a run of another kind "
                                                       r"starts on a new bucket\)$"):
                follower.adopt(forged, 3)
        assert follower.lora is None and engine.version == 2 and engine.state.keys() == v0.keys()
        assert engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0))[0].token_ids == served
        follower.adopt(settings(model, sync="merged"), 3)  # merged versions are full weights: the same kind
        _publish(bucket, states[2:])
        assert follower.sync() == 3 and engine.version == 3
        status = follower.status()
        assert status["refused"] == {"mode switch": 1} and status["failures"] == 0 and status["last_error"] is None
        follower.close()
    # The reverse: a server that serves an adapter's version refuses full weights, and another adapter.
    lora = settings(model)
    adapter = {n: t.clone() for n, t in adapter_tensors(peft_model(model, lora)).items()}
    _publish(adapters, [adapter])
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, adapters, FAST)
        follower.adopt(lora, 2)
        assert follower.sync() == 1
        for run, line in [(None, "full weights"), (settings(model, r=8), "a LoRA adapter of rank 8, alpha 16 on")]:
            with pytest.raises(LoraRefusedError, match=f"^the run now publishes {line}.*, but this server serves "
                                                       "version 1 of the bucket, which holds a LoRA adapter of rank 4, "
                                                       "alpha 8 on q_proj"):
                follower.adopt(run, 2)
        assert follower.lora == lora and engine.version == 1 and engine.state.keys() == adapter.keys()
        assert follower.status()["refused"] == {"mode switch": 2}
        follower.close()


def test_targets_that_are_not_linear_layers_are_refused_before_anything_is_dropped(tmp_path, model, caplog):
    """`layers` or `model` name modules that are no linear layer: refused in one line (not PEFT's printout of the
    module), the version served kept; the model's modules are read once, from its config (no weights)."""
    from rollout_space.errors import LoraRefusedError
    from tests._lora import settings

    bucket = str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    _publish(bucket, [step(v0, sorted(v0)[::2], seed=1)])
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        engine.update({}, 7)  # serves a version of its own (not one of the bucket's: nothing held there)
        for targets, line in [(("layers",), r"the run's --lora-targets layers names model\.layers, a ModuleList: an "
                                            r"adapter is built on linear layers only \(down_proj, gate_proj, k_proj, "
                                            r"lm_head, o_proj, q_proj, up_proj, v_proj\)"),
                              (("q_proj", "model"), r"the run's --lora-targets model names model, a Qwen3Model: "),
                              (("q_prj",), r"the run's --lora-targets q_prj matches no module of the model; its linear "
                                           r"layers are: down_proj, ")]:
            with pytest.raises(LoraRefusedError, match=f"^{line}"):
                follower.adopt(settings(model, targets=targets), 3)
        assert follower.lora is None and engine.version == 7 and engine.state.keys() == v0.keys()
        assert follower.status()["refused"] == {"bad targets": 3}
        assert all("\n" not in r.getMessage() for r in caplog.records)
        follower.close()


@pytest.mark.parametrize("run, keep, followed, held, refusal", [
    (None, 10_001, None, 5, None),  # full weights keep nothing
    ("adapter", 16, None, None, None),
    ("adapter", 17, None, None, "too many versions"),
    ("adapter", 2, None, 5, "mode switch"),
    ("adapter", 2, None, None, None),  # nothing of the bucket served yet: the server's first run
    ("merged", 2, None, 5, None),
    (None, 1, "adapter", 5, "mode switch"),
    (None, 1, "adapter", None, None),
    ("adapter r8", 2, "adapter", 5, "mode switch"),
    ("adapter alpha", 2, "adapter", 5, "mode switch"),
    ("adapter", 2, "adapter", 5, None),
    ("another base", 2, None, None, "another base"),
])
def test_what_run_a_server_follows_is_decided_from_what_it_serves(run, keep, followed, held, refusal):
    from rollout_space.follower import run_refusal
    from wire.lora import DEFAULT_TARGETS, LoraSettings

    base = "sum128:" + "ab" * 16
    kinds = {"adapter": {}, "merged": {"sync": "merged"}, "adapter r8": {"r": 8}, "adapter alpha": {"alpha": 3.0},
             "another base": {"base_hash": "sum128:" + "cd" * 16}}

    def lora(kind):
        return None if kind is None else LoraSettings(**{**dict(sync="adapter", r=4, alpha=8.0, targets=DEFAULT_TARGETS,
                                                                base_model="m", base_hash=base), **kinds[kind]})

    got = run_refusal(lora(run), keep, base_hash=base, followed=lora(followed), held=held)
    assert (got and got[0]) == refusal


def test_a_restarting_server_names_its_version_only_from_a_signed_entry(tmp_path, model):
    from dataclasses import replace

    from delta.bucket.manifest import MANIFEST_DIR

    bucket = str(tmp_path / "bucket")
    v1 = delta.load_state(model)
    names = sorted(v1)
    states = [v1, step(v1, names[:2], seed=1)]
    states.append(step(states[-1], names[2:4], seed=2))
    _publish(bucket, states)
    # A writer without the trainer's key commits a manifest whose version 3 claims the model's (version 1's) hash.
    storage = delta.Bucket.open(bucket)
    manifest = read_manifest(storage)
    forged = replace(manifest.versions[2], state_hash=manifest.get(1).state_hash)
    forged_manifest = replace(manifest, commit=manifest.commit + 1, versions=manifest.versions[:2] + (forged,))
    storage.write(f"{MANIFEST_DIR}{forged_manifest.commit:010d}.json", forged_manifest.to_json())
    with open_engine("transformers", EngineConfig(model)) as engine:
        follower = Follower(engine, bucket, FAST)
        assert engine.version == 1 and follower.decoded_version == 1  # not 3: that entry's signature does not hold
        with pytest.raises(delta.UntrustedVersionError):
            follower.sync()
        status = follower.status()
        assert follower.decoded_version == 2 and status["refused"] == {"untrusted version": 1}
        assert status["latest_version"] == 2  # the forged version 3 is no version of the trainer's
        follower.close()
