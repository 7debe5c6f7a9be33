"""`python -m delta` end to end on real files: each command as `delta.cli.main` runs it for the entry point, in this
process (an interpreter with torch each time cost the suite two minutes); `python -m delta` itself runs as a process in
tests/test_crafted.py, tests/test_foreign.py and tests/test_follow.py."""

from __future__ import annotations

import re
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO

import pytest
from safetensors.torch import save_file

import delta
from delta import cli

from ._states import adam_like, states_equal


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m delta ARGS` with `env` added to the environment: its exit status and what it printed."""
    out, err = StringIO(), StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(out), redirect_stderr(err):
        for name, value in (env or {}).items():
            patch.setenv(name, value)
        try:
            code = cli.main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    old, new = adam_like(n=30_000, lr=5e-5)
    save_file(old, d / "old.safetensors")
    model = d / "new-model"
    model.mkdir()
    save_file(new, model / "model.safetensors")  # a model folder works as well as a file
    return d, old, new


def test_diff_inspect_verify_apply(files):
    d, old, new = files
    out = run("diff", str(d / "old.safetensors"), str(d / "new-model"), "-o", str(d / "v1.delta"), "--version", "1",
              "--base-version", "0")
    assert out.returncode == 0, out.stderr
    assert "B/changed, codec ctx" in out.stdout

    out = run("inspect", str(d / "v1.delta"))
    assert out.returncode == 0, out.stderr
    assert "codec         ctx" in out.stdout and "layers.0.w" in out.stdout and "version       1  (base 0)" in out.stdout

    assert run("verify", str(d / "v1.delta")).returncode == 0
    out = run("verify", str(d / "v1.delta"), "--base", str(d / "old.safetensors"))
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stderr

    out = run("apply", str(d / "old.safetensors"), str(d / "v1.delta"), "-o", str(d / "v1.safetensors"))
    assert out.returncode == 0, out.stderr
    assert states_equal(delta.load_state(str(d / "v1.safetensors")), new)


def test_bad_input_exits_nonzero_and_writes_nothing(files):
    d, old, new = files
    (d / "junk.delta").write_bytes(b"not a delta at all")
    out = run("apply", str(d / "old.safetensors"), str(d / "junk.delta"), "-o", str(d / "never.safetensors"))
    assert out.returncode == 1
    assert out.stderr.startswith("error: ") and "junk.delta" in out.stderr
    assert not (d / "never.safetensors").exists()

    out = run("verify", str(d / "junk.delta"))
    assert out.returncode == 1 and "error:" in out.stderr

    out = run("diff", str(d / "missing.safetensors"), str(d / "old.safetensors"), "-o", str(d / "x.delta"))
    assert out.returncode == 1 and "no such file or folder" in out.stderr
    assert not (d / "x.delta").exists()

    # A delta applied to the wrong base: refused, nothing written.
    assert run("diff", str(d / "old.safetensors"), str(d / "new-model"), "-o", str(d / "v1b.delta")).returncode == 0
    out = run("apply", str(d / "new-model"), str(d / "v1b.delta"), "-o", str(d / "never.safetensors"))
    assert out.returncode == 1 and "apply the deltas in order" in out.stderr
    assert not (d / "never.safetensors").exists()


def test_bucket_commands_publish_log_pull_gc(tmp_path):
    from ._trainer import trajectory

    states = trajectory(4, n=20_000)
    bucket = str(tmp_path / "bucket")
    for i, s in enumerate(states[1:], start=1):
        save_file(s, tmp_path / f"s{i}.safetensors")
        out = run("publish", str(tmp_path / f"s{i}.safetensors"), "--bucket", bucket, "--anchor-every", "2",
                  *(["--create"] if i == 1 else []))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"published version {i} ")

    out = run("log", "--bucket", bucket)
    title, header, *lines = out.stdout.splitlines()
    assert out.returncode == 0 and [line.split()[:3] for line in lines] == [
        ["1", "anchor", "-"], ["2", "delta", "1"], ["3", "anchor", "2"], ["4", "delta", "3"]]
    assert title == f"{bucket}: versions 1..4 (2 with an anchor), manifests/0000000004.json"
    assert header.split()[:6] == ["version", "kind", "base", "files", "delta", "anchor"]
    assert re.search(r" \d+\.\d kB .* sum128:[0-9a-f]{32}  [0-9a-f]{12}$", lines[0]), lines[0]
    assert re.search(r"^ +2  delta +1 +1 +\d+(\.\d)? k?B +- ", lines[1]), lines[1]

    out = run("pull", "--bucket", bucket, "-o", str(tmp_path / "v2.safetensors"), "--version", "2")
    assert out.returncode == 0, out.stderr
    assert states_equal(delta.load_state(str(tmp_path / "v2.safetensors")), states[2])

    out = run("gc", "--bucket", bucket, "--keep-anchors", "1")
    assert out.returncode == 0 and "dropped versions [1, 2]" in out.stdout, out.stdout + out.stderr
    out = run("pull", "--bucket", bucket, "-o", str(tmp_path / "never.safetensors"), "--version", "2")
    assert out.returncode == 1 and "not in the manifest" in out.stderr
    assert not (tmp_path / "never.safetensors").exists()
    out = run("pull", "--bucket", bucket, "-o", str(tmp_path / "v4.safetensors"))
    assert out.returncode == 0 and states_equal(delta.load_state(str(tmp_path / "v4.safetensors")), states[4])


def test_publish_hands_over_to_a_new_key_from_a_file_or_the_variable_never_an_argument(tmp_path):
    """`publish --handover-from-file` (or DELTA_HANDOVER_FROM): the old key's versions signed again with the new key
    and a handover from the old one, which a reader that trusts the old key follows; the old key is never taken on the
    command line, and a file that holds no key is refused without being quoted."""
    from ._trainer import trajectory

    states = trajectory(3, n=20_000)
    bucket = str(tmp_path / "bucket")
    old, new, third = delta.SigningKey.generate(), delta.SigningKey.generate(), delta.SigningKey.generate()
    for i, s in enumerate(states[1:], start=1):
        save_file(s, tmp_path / f"s{i}.safetensors")
    out = run("publish", str(tmp_path / "s1.safetensors"), "--bucket", bucket, "--create",
              env={"DELTA_SIGNING_KEY": old.secret_text()})
    assert out.returncode == 0, out.stderr
    reader = delta.Subscriber(bucket, trust=delta.Trust.for_bucket(delta.Bucket.open(bucket).url, old.public))
    assert reader.sync() == 1
    kept = tmp_path / "old.key"
    kept.write_text(old.secret_text() + "\n")
    kept.chmod(0o600)
    out = run("publish", str(tmp_path / "s2.safetensors"), "--bucket", bucket, "--handover-from-file", str(kept),
              env={"DELTA_SIGNING_KEY": new.secret_text()})
    assert out.returncode == 0, out.stderr
    assert f"signed by {new.public.fingerprint}, handed over from {old.public.fingerprint}" in out.stdout
    assert reader.sync() == 2 and reader.trust.key == new.public and states_equal(reader.state, states[2])
    out = run("publish", str(tmp_path / "s3.safetensors"), "--bucket", bucket,
              env={"DELTA_SIGNING_KEY": third.secret_text(), "DELTA_HANDOVER_FROM": new.secret_text()})
    assert out.returncode == 0 and f"handed over from {new.public.fingerprint}" in out.stdout, out.stderr
    assert reader.sync() == 3 and reader.trust.key == third.public
    assert [v.signer for v in delta.read_manifest(delta.Bucket.open(bucket)).versions] == [third.public.text] * 3
    assert new.secret_text() not in out.stdout + out.stderr

    kept.write_text(old.secret_text()[:-3] + "\n")  # not a key: refused in one line, never quoted
    out = run("publish", str(tmp_path / "s3.safetensors"), "--bucket", bucket, "--handover-from-file",
              old.secret_text())  # the key itself where its file goes: refused, and not quoted back into a log
    assert out.returncode == 1 and "expected the path of a file holding the trainer's previous key, not a key" in (
        out.stderr) and old.secret_text()[16:] not in out.stderr
    out = run("publish", str(tmp_path / "s3.safetensors"), "--bucket", bucket, "--handover-from-file", str(kept))
    assert out.returncode == 1 and out.stderr.splitlines()[-1] == (
        f"error: {kept} does not hold a private key: expected 'ed25519-private:' and 43 base64 characters, or a key "
        "file kept in ~/.cache/delta/keys")
    assert old.secret_text()[16:-3] not in out.stderr


def test_pull_writes_only_what_the_trusted_key_signed(tmp_path):
    """`pull --trusted-key` refuses a version another key signed (exit 1, the reason in one `error:` line, nothing
    written); a bucket of unsigned versions (an older delta's) is pulled only with --unauthenticated, which it says."""
    from dataclasses import replace

    from delta.bucket.manifest import write_manifest

    from ._trainer import trajectory

    states = trajectory(2, n=20_000)
    bucket, output = str(tmp_path / "bucket"), tmp_path / "pulled.safetensors"
    trainer, stranger = delta.SigningKey.generate(), delta.SigningKey.generate()
    with delta.Publisher(bucket, signing_key=trainer) as pub:
        pub.publish(states[1])
        assert pub.flush(timeout=60)
    with delta.Publisher(bucket, signing_key=stranger) as pub:
        pub.publish(states[2])
        assert pub.flush(timeout=60)
    out = run("pull", "--bucket", bucket, "--trusted-key", trainer.public.text, "-o", str(output))
    assert out.returncode == 1 and not output.exists(), out.stderr
    error = out.stderr.splitlines()[-1]
    assert error == (f"error: version 2 is signed by {stranger.public.fingerprint}, not by the trusted "
                     f"{trainer.public.fingerprint}, and no handover signed by the trusted key introduces it")

    storage = delta.Bucket.open(bucket)
    manifest = delta.read_manifest(storage)
    write_manifest(storage, replace(manifest, versions=tuple(replace(v, run=None, signer=None, signature=None)
                                                             for v in manifest.versions)))
    out = run("pull", "--bucket", bucket, "--trusted-key", stranger.public.text, "-o", str(output))
    assert out.returncode == 1 and not output.exists(), out.stderr
    assert out.stderr.splitlines()[-1].startswith("error: version 2 is unsigned: ")
    out = run("pull", "--bucket", bucket, "--unauthenticated", "-o", str(output))
    assert out.returncode == 0, out.stderr
    assert states_equal(delta.load_state(str(output)), states[2])
    assert "(verified; unauthenticated: the weights are applied whoever wrote them)" in out.stdout


def test_a_bucket_folder_that_does_not_exist_is_a_usage_error_and_is_not_created(files, tmp_path):
    d, old, _ = files
    missing = tmp_path / "mistyped"
    for args in (["log"], ["pull", "-o", str(tmp_path / "out.safetensors")], ["gc", "--keep-anchors", "1"],
                 ["publish", str(d / "old.safetensors")], ["follow", "--vllm-url", "http://127.0.0.1:9"]):
        out = run(*args, "--bucket", str(missing))
        assert out.returncode == 2, (args, out.stdout, out.stderr)
        assert out.stderr.startswith(f"error: the bucket folder '{missing}' does not exist") and \
            out.stderr.count("\n") == 1, out.stderr
        assert not missing.exists()
    assert "pass --create" in run("publish", str(d / "old.safetensors"), "--bucket", str(missing)).stderr
    out = run("publish", str(d / "old.safetensors"), "--bucket", str(missing), "--create")
    assert out.returncode == 0 and missing.is_dir(), out.stderr


@pytest.mark.parametrize("index, message", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object with a non-empty 'weight_map' object"),
    ('{"weight_map": 5}', "expected a JSON object"),
    ('{"weight_map": {"a.w": 5}}', "weight_map['a.w'] must name a .safetensors file in the folder, got 5"),
    ('{"weight_map": {"a.w": "../old.safetensors"}}', "got '../old.safetensors'"),
    ('{"weight_map": {"a.w": "/etc/passwd"}}', "got '/etc/passwd'"),
])
def test_a_malformed_model_folder_index_is_refused_in_one_line(tmp_path, index, message):
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(delta.DeltaFormatError, match=re.escape(message)) as e:
        delta.load_state(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path}/model.safetensors.index.json: ") and "\n" not in str(e.value)


def test_every_command_reading_a_model_folder_says_what_is_wrong_with_its_index(files, tmp_path):
    d, _, _ = files
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors.index.json").write_text('{"weight_map": {"a.w": ["model.safetensors"]}}')
    assert run("diff", str(d / "old.safetensors"), str(d / "old.safetensors"), "-o", str(tmp_path / "x.delta")
               ).returncode == 0
    for args in (["diff", str(model), str(d / "old.safetensors"), "-o", str(tmp_path / "y.delta")],
                 ["verify", str(tmp_path / "x.delta"), "--base", str(model)],
                 ["apply", str(model), str(tmp_path / "x.delta"), "-o", str(tmp_path / "y.safetensors")]):
        out = run(*args)
        assert out.returncode == 1 and out.stderr == (
            f"error: {model}/model.safetensors.index.json: weight_map['a.w'] must name a .safetensors file in the "
            "folder, got ['model.safetensors']\n"), out.stderr
