"""The transformers engine, and through it the engine interface's contract (rollout_space.engines.base)."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
import torch

import delta
from rollout_space.engines import (
    EngineConfig, EngineError, SamplingParams, UpdateRefusedError, open_engine,
)
from tests._engines import build_model, follow, step

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Once upon a time", [5, 6, 7, 8, 9, 10, 11]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_model(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a GPU"))])
def engine(model_dir: str, request: pytest.FixtureRequest):
    """The engine on each device there is: the contract holds on the CPU and on a GPU alike."""
    config = EngineConfig(model_dir, dtype="float32", max_model_len=128, device=request.param)
    with open_engine("transformers", config, version=7) as e:
        yield e


def test_generate_returns_tokens_logprobs_and_version(engine) -> None:
    completions = engine.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0))
    assert len(completions) == 3
    for c, prompt in zip(completions, PROMPTS):
        assert c.version == 7
        assert c.prompt_ids == (engine.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
        assert len(c.token_ids) == len(c.logprobs) == 6 and c.finish_reason == "length"
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.text == engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert engine.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0)) == completions


def test_sampled_logprobs_are_the_raw_distribution(engine) -> None:
    # Sampled at temperature 0.5, reported under the model's own distribution: scoring the prompt with
    # the completion appended gives the same numbers.
    completions = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.5, seed=1))
    scored = engine.prompt_logprobs([c.prompt_ids + c.token_ids for c in completions])
    for c, row in zip(completions, scored):
        assert row[len(c.prompt_ids) - 1:] == pytest.approx(c.logprobs, abs=1e-5)


def test_seed_reproduces_and_identical_prompts_differ(engine) -> None:
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=3)
    first = engine.generate(["Once upon a time"] * 2, params)
    assert engine.generate(["Once upon a time"] * 2, params) == first
    assert first[0].token_ids != first[1].token_ids


def test_stops_on_a_stop_token_and_keeps_it(engine) -> None:
    [free] = engine.generate(["Once upon a time"], SamplingParams(max_tokens=6, temperature=0))
    k = next(i for i, t in enumerate(free.token_ids) if i > 0 and t not in free.token_ids[:i])
    params = SamplingParams(max_tokens=6, temperature=0, stop_token_ids=(free.token_ids[k],))
    [stopped] = engine.generate(["Once upon a time"], params)
    assert stopped.token_ids == free.token_ids[:k + 1] and stopped.logprobs == free.logprobs[:k + 1]
    assert stopped.finish_reason == "stop"


def stop_string_at(engine, token_ids: list[int]) -> tuple[str, int]:
    """A stop string that first appears in the text of `token_ids` with their k-th token, and k + 1."""
    for k in range(1, len(token_ids)):
        text = engine.tokenizer.decode(token_ids[k:k + 1])
        if text.strip() and "\ufffd" not in text and text not in engine.tokenizer.decode(token_ids[:k]):
            return text, k + 1
    raise AssertionError(f"no token with new text in {token_ids}")


def test_stops_on_a_stop_string_in_a_batch_and_keeps_it(engine) -> None:
    prompts = ["Once upon a time", "The quick brown fox"]
    free = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
    stop, end = stop_string_at(engine, free[0].token_ids)
    stopped = engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0, stop=(stop,)))
    assert stopped[0].token_ids == free[0].token_ids[:end] and stopped[0].logprobs == free[0].logprobs[:end]
    assert stopped[0].finish_reason == "stop" and stopped[0].text.endswith(stop)
    if stop not in free[1].text:  # the other row runs on as it did without the stop string
        assert stopped[1] == free[1]
    with pytest.raises(ValueError, match="stop strings must not be empty"):
        SamplingParams(stop=("",))


def test_text_never_ends_in_half_a_character(engine) -> None:
    from rollout_space.engines.base import whole_characters

    text = "café 🟩 naïve"
    ids = engine.tokenizer.encode(text, add_special_tokens=False)
    halves = [n for n in range(len(ids)) if engine.tokenizer.decode(ids[:n]).endswith("\ufffd")]
    assert halves  # the byte-level tokenizer does split characters: the case this guards
    for n in range(len(ids) + 1):
        shown = whole_characters(engine.tokenizer, ids[:n])
        assert "\ufffd" not in shown and text.startswith(shown)


def test_update_equals_a_fresh_engine_on_the_new_state(engine, model_dir: str, tmp_path) -> None:
    old = {n: t.clone() for n, t in engine.state.items()}  # follow() writes into engine.state
    new = step(old, sorted(old), seed=1)
    before = engine.prompt_logprobs(PROMPTS)
    names = follow(engine, delta.diff(old, new, version=8, base_version=7))
    # A 1e-3 step moves no bf16 weight at 1.0 (half its ULP is 4e-3): the norms stay as they were.
    assert set(names) == {n for n in old if not torch.equal(old[n], new[n])} and engine.version == 8
    assert any("norm" in n for n in set(old) - set(names))
    assert all(torch.equal(engine.state[n].view(torch.int16), new[n].view(torch.int16)) for n in new)

    fresh_dir = shutil.copytree(model_dir, tmp_path / "v8")
    delta.save_state(new, os.path.join(fresh_dir, "model.safetensors"))
    config = EngineConfig(str(fresh_dir), dtype="float32", max_model_len=128, device=engine.config.device)
    with open_engine("transformers", config) as fresh:
        after = engine.prompt_logprobs(PROMPTS)
        assert after == fresh.prompt_logprobs(PROMPTS)
    assert after != before
    assert [c.version for c in engine.generate(PROMPTS, SamplingParams(max_tokens=2))] == [8, 8, 8]


@pytest.mark.parametrize("bad, problem", [
    ({"model.layers.9.mlp.up_proj.weight": torch.zeros(2)}, "the model has no tensor 'model.layers.9.mlp.up_proj.weight'"),
    ({"model.norm.weight": torch.ones(3, dtype=torch.bfloat16)},
     "'model.norm.weight' is torch.bfloat16 (3,), the published state holds torch.bfloat16 (64,)"),
    ({"model.norm.weight": torch.ones(64)}, "'model.norm.weight' is torch.float32 (64,), the published state holds "
                                            "torch.bfloat16 (64,)"),
])
def test_refused_update_changes_nothing(engine, bad: dict, problem: str) -> None:
    before = engine.prompt_logprobs(PROMPTS)
    state = {n: t.clone() for n, t in engine.state.items()}
    changed = {"model.embed_tokens.weight": torch.zeros_like(engine.state["model.embed_tokens.weight"]), **bad}
    with pytest.raises(UpdateRefusedError) as info:
        engine.update(changed, version=8)
    assert str(info.value).startswith(f"update to version 8 refused, still serving version 7: {problem}. ")
    assert info.value.problems == [problem] and info.value.serving == 7
    assert engine.version == 7 and engine.prompt_logprobs(PROMPTS) == before
    assert all(torch.equal(engine.state[n], state[n]) for n in state)


def test_paused_holds_generation_off(engine) -> None:
    done = threading.Event()
    worker = threading.Thread(target=lambda: (engine.generate(["Once"], SamplingParams(max_tokens=1)), done.set()))
    with engine.paused():
        worker.start()
        assert not done.wait(0.3)
    assert done.wait(30)
    worker.join()


def test_bad_requests_say_what_to_change(engine, model_dir: str) -> None:
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate(["a", []])
    with pytest.raises(ValueError, match=r"prompt 0 has token ids outside the vocabulary \[0, 1024\)"):
        engine.prompt_logprobs([[5, 1024]])
    with pytest.raises(ValueError, match="prompt 0 has 100 tokens, \\+ 64 to generate is over max_model_len 128"):
        engine.generate([[5] * 100])
    with pytest.raises(ValueError, match="is not a local folder"):
        EngineConfig(os.path.join(model_dir, "missing"))
    with pytest.raises(ValueError, match="dtype 'fp8'"):
        EngineConfig(model_dir, dtype="fp8")
    with pytest.raises(ValueError, match="unknown engine 'sglang'; choose one of transformers, vllm"):
        open_engine("sglang", EngineConfig(model_dir))
    engine.close()
    engine.close()
    with pytest.raises(EngineError, match="the engine is closed"):
        engine.generate(["a"])


def test_close_ends_a_generation_in_flight(model_dir: str) -> None:
    """A server told to stop does not wait out a long batch: the generation ends at its next token and
    the caller gets an EngineError, not a cut completion."""
    engine = open_engine("transformers", EngineConfig(model_dir, dtype="float32", max_model_len=2048))
    outcome: list[object] = []

    def generate() -> None:
        try:
            outcome.append(engine.generate(["Once"] * 16, SamplingParams(max_tokens=2000, temperature=1.0, seed=0)))
        except EngineError as e:
            outcome.append(e)

    worker = threading.Thread(target=generate)
    worker.start()
    threading.Event().wait(1.0)  # 16 x 2,000 tokens take a minute or more here: still generating
    engine.close()
    worker.join(30)
    assert not worker.is_alive()
    assert isinstance(outcome[0], EngineError) and "closed while generating" in str(outcome[0])
    with pytest.raises(EngineError, match="closed"):
        engine.generate(["Once"], SamplingParams(max_tokens=1))


def test_interrupt_ends_a_long_prefill_part_way(model_dir: str) -> None:
    """A prefill over long conversations is one forward pass, tens of seconds on a busy CPU, which the stopping
    criteria see only after it: an interrupt ends it at the next layer (`models.interrupt.Breaker`)."""
    engine = open_engine("transformers", EngineConfig(model_dir, dtype="float32", max_model_len=2048))
    prefilling = threading.Event()

    layers_run: list[int] = []

    def a_slow_cpu(*_: object) -> None:  # each layer of the prefill takes 3 s
        layers_run.append(1)
        prefilling.set()
        threading.Event().wait(3.0)

    for layer in engine._model.model.layers:  # 2 layers: 6 s, then a token's time for the stopping criteria
        layer.register_forward_pre_hook(a_slow_cpu)
    outcome: list[object] = []

    def generate() -> None:
        try:
            outcome.append(engine.generate([[5] * 1000] * 4, SamplingParams(max_tokens=8)))
        except EngineError as e:
            outcome.append(e)

    worker = threading.Thread(target=generate)
    worker.start()
    assert prefilling.wait(60)
    engine.interrupt()
    worker.join(30)
    assert not worker.is_alive() and len(layers_run) == 1, "the prefill's next layer ran"
    assert isinstance(outcome[0], EngineError) and "closed while generating" in str(outcome[0])
    engine.close()



def test_close_does_not_wait_on_a_call_that_does_not_return(model_dir: str, caplog) -> None:
    """A stopping server closes its engine within its bound even when a call holds the engine past the interrupt
    (a load stuck in a driver call, say): the backend is left to the process's end, and that is logged."""
    engine = open_engine("transformers", EngineConfig(model_dir, dtype="float32", max_model_len=128))
    holding, release = threading.Event(), threading.Event()

    def stuck_load() -> None:
        with engine.paused():  # what `update` holds while it loads
            holding.set()
            release.wait(60)

    worker = threading.Thread(target=stuck_load)
    worker.start()
    assert holding.wait(10)
    closed = engine.close(timeout=0.5)
    assert worker.is_alive()  # still held while close returned: it did not wait for the call
    release.set()
    worker.join(10)
    assert not closed
    assert "a call in flight still held the engine after 0.5 s: not closing it" in caplog.text
    assert engine.close(timeout=0.5)  # free now: it closes
    with pytest.raises(EngineError, match="closed"):
        engine.generate(["Once"], SamplingParams(max_tokens=1))


def test_an_adapter_is_served_under_peft_in_place_and_taken_off_again(model_dir: str) -> None:
    from tests._lora import logprobs, peft_model, settings
    from trainer_space.lora import adapter_tensors

    lora = settings(model_dir)
    trained = peft_model(model_dir, lora)
    adapter = {n: t.clone() for n, t in adapter_tensors(trained).items()}
    ids = [5, 6, 7, 8, 9, 10, 11]
    with open_engine("transformers", EngineConfig(model_dir, dtype="float32", max_model_len=128), version=3) as engine:
        assert engine.adapter_refusal(lora) is None
        [base] = engine.prompt_logprobs([ids])
        engine.serve_adapter(lora)
        assert engine.version == 0 and list(engine.state) == list(adapter)
        assert {t.dtype for t in engine.state.values()} == {torch.float32}
        assert engine.prompt_logprobs([ids]) == [base]  # PEFT starts lora_B at zero: the base's outputs
        engine.update({n: t.clone() for n, t in adapter.items()}, version=5)
        [served] = engine.prompt_logprobs([ids])
        assert engine.version == 5 and torch.allclose(torch.tensor(served), logprobs(trained, ids), atol=1e-5)
        assert delta.state_digest(engine.state).hexdigest == delta.state_digest(adapter).hexdigest
        assert max(abs(a - b) for a, b in zip(served, base)) > 1e-3  # the adapter is what changed them
        engine.serve_adapter(None)  # the base again, from the folder, without PEFT's layers
        assert engine.version == 0 and list(engine.state) == list(delta.load_state(model_dir))
        assert engine.prompt_logprobs([ids]) == [base]


def test_an_adapter_the_engine_cannot_serve_is_refused_before_anything_changes(model_dir: str) -> None:
    """Targets that match no module, or name one that is no linear layer, and a rank above the engine's cap: refused in
    one line (not PEFT's printout of the module) while the engine serves what it served."""
    from tests._lora import settings
    from wire.lora import MAX_ADAPTER_RANK

    ids = [5, 6, 7, 8, 9, 10, 11]
    with open_engine("transformers", EngineConfig(model_dir, dtype="float32", max_model_len=128), version=3) as engine:
        [base] = engine.prompt_logprobs([ids])
        engine.serve_adapter(settings(model_dir))
        adapter = list(engine.state)
        assert engine.adapter_support == "LoRA adapters up to rank 512 (PEFT)"
        for lora, reason, line in [
            (settings(model_dir, targets=("no_such_proj",)), "bad targets",
             "the run's --lora-targets no_such_proj matches no module of the model; its linear layers are: down_proj, "
             "gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
            (settings(model_dir, targets=("layers",)), "bad targets",
             "the run's --lora-targets layers names model.layers, a ModuleList: an adapter is built on linear layers "
             "only (down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj, v_proj)"),
            (settings(model_dir, r=MAX_ADAPTER_RANK + 1), "rank above max",
             "the run's adapter has rank 513, above the transformers engine's cap of 512: run the trainer with "
             "--lora-r 512 or less, or --lora-sync merged"),
        ]:
            assert engine.adapter_refusal(lora) == (reason, line)
            with pytest.raises(EngineError) as refused:
                engine.serve_adapter(lora)
            assert str(refused.value) == line
        assert engine.version == 0 and list(engine.state) == adapter
        assert engine.prompt_logprobs([ids]) == [base]  # the zero adapter still served
