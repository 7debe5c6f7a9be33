"""`spaces/deploy.py` for real against the local Hub (`tests/local_hub/`): the bucket, each Space with its variables,
secrets, hardware request and files, as the real huggingface_hub sends them; a second deploy that changes nothing it
need not; and each way it can fail said in one line (a read-only token, an unreachable Hub).

The first deploy is the script as a user runs it (`python spaces/deploy.py`, HF_ENDPOINT and HF_TOKEN in its
environment); the others call `deploy()` in this process, to keep them fast, with huggingface_hub's endpoint set as
HF_ENDPOINT sets it when huggingface_hub is imported (`constants.ENDPOINT`). Not `HfApi(endpoint=...)`: with that,
`create_repo(exist_ok=True)` after a 403 builds its `RepoUrl` on huggingface.co and raises `HfUriError` (2.4.0).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._ports import free_port
from tests.local_hub.server import LocalHub

from ._deploy import deploy_module
from ._env_server import REPO

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SPACES = REPO / "spaces"
BUCKET = "hf://buckets/alice/wordle-deltas"
#: The routes one deploy calls (and nothing else: no unknown route), each Space's files being new.
DEPLOY_ROUTES = {"api.bucket_create", "api.repo_create", "api.space_variable_add", "api.space_secret_add",
                 "api.validate_yaml", "api.space_preupload", "api.space_commit", "api.space_hardware"}


@pytest.fixture(name="deploy_module")
def deploy_module_fixture() -> Any:
    return deploy_module()


@pytest.fixture
def hub_endpoint(local_hub: LocalHub, monkeypatch: pytest.MonkeyPatch) -> LocalHub:
    """The local Hub, as this process's huggingface_hub endpoint (what HF_ENDPOINT does at import)."""
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", local_hub.endpoint)
    return local_hub


def run_deploy(hub: LocalHub, tmp_path: Path, *args: str, scope: str = "write") -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "HF_XET_CACHE": str(tmp_path / "xet"),
           **hub.env("alice", scope)}
    return subprocess.run([sys.executable, "spaces/deploy.py", "--namespace", "alice", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=180, check=False)


def test_deploy_creates_the_private_bucket_and_each_space_with_its_settings_and_files(
        local_hub: LocalHub, tmp_path: Path, deploy_module: Any) -> None:
    from delta import SigningKey

    result = run_deploy(local_hub, tmp_path, "--rollouts", "2", "--owner-token", "the-owner")
    assert result.returncode == 0, result.stderr
    counts = local_hub.counts()
    assert counts["unknown"] == [] and set(counts["routes"]) == DEPLOY_ROUTES, counts["routes"]
    assert counts["routes"]["api.space_commit"] == 4 and counts["routes"]["api.space_hardware"] == 3  # no env's

    api = local_hub.api("alice")
    assert api.bucket_info("alice/wordle-deltas").private is True
    ids = ["alice/wordle-env", "alice/wordle-rollout", "alice/wordle-rollout-2", "alice/wordle-trainer"]
    spaces = {space_id: local_hub.space(space_id) for space_id in ids}
    env, rollout, rollout_2, trainer = spaces.values()
    # what the real client reads back: SDKs, variables, the secrets' names (never their values), hardware
    assert [api.space_info(space_id).sdk for space_id in ids] == ["gradio", "docker", "docker", "docker"]
    for space_id, space in spaces.items():
        assert {k: v.value for k, v in api.get_space_variables(space_id).items()} == space["variables"]
        assert set(api.get_space_secrets(space_id)) == set(space["secrets"])
        listing = httpx.get(f"{local_hub.endpoint}/api/spaces/{space_id}/secrets",
                            headers={"authorization": f"Bearer {local_hub.token('alice')}"}).text
        assert not any(value in listing for value in space["secrets"].values())
    assert [api.get_space_runtime(space_id).requested_hardware for space_id in ids] == ["cpu-basic"] + ["l4x1"] * 3
    assert env["hardware_requests"] == []
    # the settings the apps find: the wiring between them, the bucket, the tokens, the trainer's key
    assert env["variables"] == {"SPACE_ROLE": "env"} and set(env["secrets"]) == {"ENV_TOKEN"}
    assert [rollout["variables"]["ROLLOUT_ID"], rollout_2["variables"]["ROLLOUT_ID"]] == ["wordle-rollout",
                                                                                        "wordle-rollout-2"]
    for space in (rollout, rollout_2, trainer):
        assert space["variables"]["ENV_URL"] == "https://alice-wordle-env.hf.space"
        assert space["variables"]["MODEL"] == "Qwen/Qwen3-0.6B"
        assert space["secrets"]["DELTA_BUCKET"] == BUCKET and space["secrets"]["HF_TOKEN"] == local_hub.token("alice")
        assert space["secrets"]["ROLLOUT_TOKEN"] == trainer["secrets"]["ROLLOUT_TOKEN"]
    assert rollout["secrets"]["ENV_TOKEN"] == rollout_2["secrets"]["ENV_TOKEN"] == env["secrets"]["ENV_TOKEN"]
    assert trainer["secrets"]["OWNER_TOKEN"] == "the-owner" and "APP_ARGS" in trainer["variables"]
    public = SigningKey.parse(trainer["secrets"]["DELTA_SIGNING_KEY"]).public.text
    assert rollout["variables"]["DELTA_TRUSTED_KEY"] == rollout_2["variables"]["DELTA_TRUSTED_KEY"] == public
    assert public in result.stdout and trainer["secrets"]["DELTA_SIGNING_KEY"] not in result.stdout
    # the files: what `--out` assembles, committed as they are
    for space_id, space in spaces.items():
        role = space_id.split("-")[1]
        expected = deploy_module.assemble(role, tmp_path / "assembled" / space_id.split("/")[1])
        assert set(space["files"]) == {p.relative_to(expected).as_posix() for p in expected.rglob("*") if p.is_file()}
        assert {s.rfilename for s in api.space_info(space_id).siblings} == set(space["files"])
        assert local_hub.space_file(space_id, "README.md") == (SPACES / role / "README.md").read_bytes()
        assert local_hub.space_file(space_id, "app.py") == (REPO / "app.py").read_bytes()
        assert [c["summary"] for c in space["commits"]] == ["initial commit", "deploy from delta-sync"]
    assert "Dockerfile" in trainer["files"] and "Dockerfile" not in env["files"]
    assert not any(path.startswith(("tests/", "spaces/")) for path in trainer["files"])


def test_a_second_deploy_updates_the_settings_in_place_and_commits_nothing_unchanged(
        hub_endpoint: LocalHub, deploy_module: Any, capsys: pytest.CaptureFixture[str]) -> None:
    local_hub = hub_endpoint
    token = local_hub.token("alice")
    first = deploy_module.plan("alice", "wordle", BUCKET, "owner-1", token, cpu=True)
    deploy_module.deploy(first, BUCKET, token)
    before = {p.repo_id: local_hub.space(p.repo_id) for p in first}
    local_hub.reset_counts()

    key = first[-1].secrets["DELTA_SIGNING_KEY"]  # a redeploy that keeps the trainer's key
    again = deploy_module.plan("alice", "wordle", BUCKET, "owner-2", token, cpu=True, signing_key=key)
    deploy_module.deploy(again, BUCKET, token)
    counts = local_hub.counts()
    assert counts["unknown"] == [] and "api.space_commit" not in counts["routes"], counts["routes"]
    assert counts["routes"]["api.space_preupload"] == 3  # each file's git blob id matched: nothing to commit
    assert counts["routes"]["api.space_info_revision"] == 3  # the client's "no files have been modified" path
    state = local_hub.state()
    assert list(state["buckets"]) == ["alice/wordle-deltas"] and state["buckets"]["alice/wordle-deltas"]["private"]
    assert sorted(state["spaces"]) == sorted(before)
    for plan in again:
        after = local_hub.space(plan.repo_id)
        assert after["head"] == before[plan.repo_id]["head"] and after["files"] == before[plan.repo_id]["files"]
        assert after["variables"] == plan.variables and after["secrets"] == plan.secrets
    trainer = local_hub.space("alice/wordle-trainer")
    assert trainer["secrets"]["OWNER_TOKEN"] == "owner-2" and trainer["secrets"]["DELTA_SIGNING_KEY"] == key
    assert [r["flavor"] for r in trainer["hardware_requests"]] == ["cpu-upgrade", "cpu-upgrade"]

    # a read-only token finds the bucket and the Spaces there (create_* with exist_ok ask), stops at the first write
    with pytest.raises(deploy_module.DeployError) as refused:
        deploy_module.deploy(again, BUCKET, local_hub.token("alice", "read"))
    assert str(refused.value).startswith("setting the variable SPACE_ROLE of alice/wordle-env: the Hub refused the "
                                         "token (HTTP 403: Your token is read-only")
    assert "deploying needs a token with write access to alice" in str(refused.value)
    assert "\n" not in str(refused.value)
    with pytest.raises(deploy_module.DeployError, match=r"^creating the bucket alice/wordle-deltas: the Hub refused "
                       r"the token \(HTTP 401: invalid credentials\): it is wrong, expired or revoked; set HF_TOKEN"):
        deploy_module.deploy(again, BUCKET, "hf_not_a_token")
    capsys.readouterr()


def test_a_read_only_token_stops_the_script_with_one_line_asking_for_write_access(
        local_hub: LocalHub, tmp_path: Path) -> None:
    result = run_deploy(local_hub, tmp_path, scope="read")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == (
        "error: creating the bucket alice/wordle-deltas: the Hub refused the token (HTTP 403: Your token is read-only: "
        "it cannot write to the namespace alice; use a token with write access): deploying needs a token with write "
        f"access to alice; make one at {local_hub.endpoint}/settings/tokens and set HF_TOKEN (or run `hf auth login`)"
    )
    state = local_hub.state()
    assert state["buckets"] == {} and state["spaces"] == {}


def test_an_unreachable_hub_is_one_line_too(deploy_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    plans = deploy_module.plan("alice", "wordle", BUCKET, "owner", "hf_x", cpu=True)
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", endpoint)
    with pytest.raises(deploy_module.DeployError, match=rf"^creating the bucket alice/wordle-deltas: cannot reach the "
                       rf"Hub at {endpoint} \(ConnectError: .*\); check HF_ENDPOINT and the network$"):
        deploy_module.deploy(plans, BUCKET, "hf_x")
