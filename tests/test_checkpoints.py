import json
import os

import pytest
import torch
from safetensors import safe_open

from bench.checkpoints import CheckpointParams, generate_checkpoints, load_run, main

TINY = CheckpointParams("tiny-qwen3", steps=3, lr=1e-6)


@pytest.fixture(scope="module")
def tiny_run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("tiny-run"))
    generate_checkpoints(TINY, out)
    return out


def _bytes(files: list[str]) -> list[bytes]:
    out = []
    for path in files:
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def test_tiny_run_writes_every_step_and_its_record(tiny_run_dir: str) -> None:
    run = load_run(tiny_run_dir)
    assert run is not None and run.params == TINY
    assert [os.path.basename(f) for f in run.files] == [f"step_{k:04d}.safetensors" for k in range(4)]
    with open(os.path.join(tiny_run_dir, "run.json")) as f:
        record = json.load(f)
    assert record["params"]["lr"] == 1e-6 and len(record["losses"]) == 3
    with safe_open(run.files[0], "pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "lm_head.weight" not in f.keys()
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}


def test_tiny_run_deltas_are_sparse_and_nonzero(tiny_run_dir: str) -> None:
    run = load_run(tiny_run_dir)
    assert run is not None
    for k, density in enumerate(run.density, start=1):
        assert 0 < density < 0.1, f"step {k}: density {density}"
    # The recorded count is the number of elements whose bits differ, checked here independently.
    with safe_open(run.files[0], "pt") as old, safe_open(run.files[1], "pt") as new:
        changed = sum(
            int((old.get_tensor(n).view(torch.int16) != new.get_tensor(n).view(torch.int16)).sum()) for n in old.keys()
        )
    assert changed == run.changed[0]


def test_tiny_run_is_deterministic(tiny_run_dir: str, tmp_path) -> None:
    first = load_run(tiny_run_dir)
    second = generate_checkpoints(TINY, str(tmp_path))
    assert first is not None and _bytes(second.files) == _bytes(first.files)


def test_complete_run_is_reused_and_a_different_one_replaces_it(tmp_path) -> None:
    out = str(tmp_path)
    run = generate_checkpoints(CheckpointParams("tiny-qwen3", steps=2), out)
    stamp = os.stat(run.files[1]).st_mtime_ns
    assert generate_checkpoints(CheckpointParams("tiny-qwen3", steps=2), out) == run
    assert os.stat(run.files[1]).st_mtime_ns == stamp

    shorter = generate_checkpoints(CheckpointParams("tiny-qwen3", steps=1, lr=1e-5), out)
    assert len(shorter.files) == 2 and not os.path.exists(run.files[2])
    assert shorter.changed[0] > run.changed[0]  # ten times the learning rate moves more weights


def test_cli_prints_density_per_step(tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # main sets it for its process: undone after this test
    assert main(["--data", "tiny-qwen3", "--steps", "1", "-o", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny-qwen3: 139,648 elements per state" in out and "step 1:" in out and "density" in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"data": "nope"}, "unknown data set 'nope'; choose one of smollm2-bf16, "),
        ({"data": "tiny-qwen3", "steps": 0}, "steps must be at least 1, got 0"),
        ({"data": "tiny-qwen3", "lr": 0.0}, "lr must be positive, got 0.0"),
        ({"data": "tiny-qwen3", "density": 0.1}, "density applies to uniform-synthetic only"),
        ({"data": "uniform-synthetic", "density": 2.0}, r"density must be in \(0, 1\], got 2.0"),
    ],
)
def test_bad_parameters_are_refused_with_what_to_change(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CheckpointParams(**kwargs)
