"""``app.py``: picking the role (argument, SPACE_ROLE, none) and the messages for misconfiguration.

Each case runs ``python app.py`` as a subprocess, as a Space or a user would; none gets as far as
serving (that is tested per role, and by test_app_launcher.py for all three).
"""

from __future__ import annotations

import os
import subprocess
import sys

from ._env_server import REPO

#: Variables a Space or a developer's shell may set that would change what these cases test.
SCRUBBED = ("SPACE_ROLE", "SPACE_ID", "DELTA_BUCKET", "ROLLOUT_URL", "ENV_URL", "HF_TOKEN", "OWNER_TOKEN", "APP_ARGS")


def run_app(*args: str, **environ: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    return subprocess.run([sys.executable, "app.py", *args], check=False, cwd=REPO, env={**env, **environ},
                          capture_output=True, text=True, timeout=120)


def last_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    return result.stderr.splitlines()[-1]


def test_help_lists_every_role_and_the_variables() -> None:
    result = run_app("--help")
    assert result.returncode == 0
    for text in ("env ", "rollout ", "trainer ", "all ", "SPACE_ROLE", "DELTA_BUCKET", "ROLLOUT_URL"):
        assert text in result.stdout


def test_an_unknown_role_says_which_exist() -> None:
    assert last_error(run_app("trainr")) == (
        "app.py: error: unknown role 'trainr': name one of env, rollout, trainer (e.g. `python app.py env`), "
        "or none to run all three; a Space sets the SPACE_ROLE variable instead")


def test_a_bad_space_role_says_what_to_set() -> None:
    assert last_error(run_app(SPACE_ROLE="web")) == (
        "app.py: error: SPACE_ROLE='web' is not a role: set the SPACE_ROLE variable to one of env, rollout, "
        "trainer, or unset it to run all three")


def test_space_role_picks_the_role_and_flags_still_apply() -> None:
    assert last_error(run_app("--max-sessions", "0", SPACE_ROLE="env")) == (
        "app.py env: error: argument --max-sessions: must be >= 1, got 0")


def test_app_args_gives_a_space_more_flags_and_the_command_line_wins() -> None:
    assert last_error(run_app(SPACE_ROLE="env", APP_ARGS="--max-sessions 0")) == (
        "app.py env: error: argument --max-sessions: must be >= 1, got 0")
    assert last_error(run_app("env", "--per-client", "0", APP_ARGS="--per-client 3")).endswith(
        "argument --per-client: must be >= 1, got 0")


def test_the_argument_wins_over_space_role() -> None:
    assert last_error(run_app("env", "--max-sessions", "0", SPACE_ROLE="trainer")).startswith("app.py env: error:")


def test_a_rollout_space_without_bucket_or_env_url_is_told_what_to_set() -> None:
    error = last_error(run_app(SPACE_ROLE="rollout", SPACE_ID="someone/wordle-rollout"))
    assert error == (
        "app.py rollout: error: set ENV_URL (or --env-url) to the URL of your env Space "
        "(https://USER-SPACE.hf.space): 'http://127.0.0.1:7861' points back at this machine; "
        "set DELTA_BUCKET (or --bucket) to shared storage (hf://buckets/NS/NAME or s3://BUCKET/PREFIX): "
        "the folder '.cache/bucket' is private to this Space and lost when it restarts")


def test_a_trainer_space_needs_a_token_for_hf_buckets_and_a_remote_rollout_url_if_one(tmp_path: os.PathLike[str]) -> None:
    fleet = run_app("trainer", "--bucket", "hf://buckets/someone/wordle", SPACE_ID="someone/wordle-trainer",
                    HF_HOME=str(tmp_path))  # an empty HF_HOME: no token saved by `hf auth login` either
    assert last_error(fleet) == (  # the fleet: no rollout URL needed, only the bucket
        "app.py trainer: error: the bucket hf://buckets/someone/wordle needs a Hugging Face token: set the HF_TOKEN "
        "secret (write access for the trainer, read for rollouts), or run `hf auth login`")
    result = run_app("trainer", "--bucket", "hf://buckets/someone/wordle", "--rollout-url", "http://127.0.0.1:7862",
                     SPACE_ID="someone/wordle-trainer", HF_HOME=str(tmp_path))
    assert last_error(result) == (
        "app.py trainer: error: set ROLLOUT_URL (or --rollout-url) to the URL of your rollout Space "
        "(https://USER-SPACE.hf.space): 'http://127.0.0.1:7862' points back at this machine; "
        "the bucket hf://buckets/someone/wordle needs a Hugging Face token: set the HF_TOKEN secret "
        "(write access for the trainer, read for rollouts), or run `hf auth login`")
    assert "warning: OWNER_TOKEN is not set" in result.stderr


def test_urls_must_be_http() -> None:
    assert last_error(run_app("trainer", "--rollout-url", "my-rollout.hf.space")) == (
        "app.py trainer: error: ROLLOUT_URL (or --rollout-url) must be an http(s) URL such as "
        "https://USER-SPACE.hf.space, got 'my-rollout.hf.space'")


def test_the_launcher_refuses_a_busy_port() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        error = last_error(run_app("all", "--env-port", str(port), "--model", str(REPO)))
    assert error == (f"app.py all: error: port {port} (--env-port) is in use on 127.0.0.1: stop what runs there "
                     "(another `python app.py`?) or choose another port")


def test_a_space_without_space_role_is_told_to_set_it() -> None:
    assert last_error(run_app(SPACE_ID="someone/wordle-env")) == (
        "app.py all: error: set the SPACE_ROLE variable of this Space to env, rollout or trainer: one Space runs "
        "one app (`python app.py` with no role runs all three on your own machine)")


def test_the_launcher_says_why_a_model_cannot_be_prepared() -> None:
    import socket

    ports = []
    for _ in range(4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(str(s.getsockname()[1]))
    result = run_app("all", "--model", "./no-such-folder", "--port", ports[0], "--env-port", ports[1],
                     "--rollout-port", ports[2], "--trainer-port", ports[3])
    assert result.returncode == 1
    assert ("[app] cannot prepare the model './no-such-folder': model './no-such-folder' is neither a local folder "
            "nor a Hub id like 'Qwen/Qwen3-0.6B'") in result.stdout


def test_a_wrong_flag_or_setting_is_answered_before_the_heavy_imports() -> None:
    """A command-line tool answers a usage error at once: no role loads torch, transformers or Gradio (seconds on a
    busy machine) before its flags and settings are checked."""
    probe = ("import sys, app\n"
             "try:\n    app.main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
             "heavy = sorted(m for m in ('torch', 'transformers', 'gradio', 'delta') if m in sys.modules)\n"
             "print(code, heavy)")
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED}
    for argv in (["all", "--rollouts", "0"], ["trainer", "--rollout-url", "ftp://x"], ["rollout", "--env-url", "x"],
                 ["env", "--max-sessions", "0"], ["trainer", "--no-such-flag"]):
        done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.stdout.strip() == "2 []", (argv, done.stdout, done.stderr[-500:])
