"""`delta` installs as a library of its own: the wheel holds the package alone, declares what it needs,
and imports (and runs its command) outside this checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_is_the_library_alone_and_works_outside_the_checkout(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: building writes build/ and *.egg-info beside the sources
    for package in ("delta", "delta_vllm_plugin"):  # the library and its vLLM plugin stub (no numba import)
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    (source / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "delta.md", source / "docs")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, cwd=tmp_path, timeout=300)
    [wheel] = (tmp_path / "dist").glob("delta_weight_sync-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        metadata = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"delta", "delta_vllm_plugin"}, f"the wheel carries more than the library: {sorted(packages)}"
    assert {"delta/__init__.py", "delta/tensors/bits.py", "delta/format/header.py", "delta/codecs/_chunked.py",
            "delta/patch/apply.py", "delta/bucket/publish.py", "delta/storage/__init__.py"} <= set(names)
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for dependency in ("torch", "numpy", "numba", "safetensors", "zstandard", "xxhash"):
        assert any(r.startswith(dependency) and "extra ==" not in r for r in requires), dependency
    assert any(r.startswith("s3fs") and 'extra == "s3"' in r for r in requires)
    assert any(r.startswith("huggingface_hub") and 'extra == "hf"' in r for r in requires)
    assert not any(r.split()[0].lower().startswith(("gradio", "trl", "vllm", "fastapi")) for r in requires)
    assert "delta = delta.cli:main" in entry_points
    assert "[vllm.general_plugins]\ndelta = delta_vllm_plugin:register" in entry_points

    # Installed into a fresh environment and run from a folder that is not the checkout: nothing of the apps is
    # needed. Its dependencies come from the site-packages this interpreter sees, named in a .pth file: a venv's
    # `system_site_packages` would name the base interpreter's instead, which lack torch when the suite itself
    # runs in a virtualenv.
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    inner = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                           check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    seen = [p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    Path(inner, "outer-site-packages.pth").write_text("\n".join(seen) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, cwd=tmp_path, timeout=300)
    code = ("import pathlib, torch, delta; assert 'site-packages' in delta.__file__, delta.__file__; "
            "old = {'w': torch.arange(64, dtype=torch.float32).bfloat16()}; new = {'w': old['w'].clone()}; "
            "new['w'][3] += 1; state = {'w': old['w'].clone()}; "
            "delta.apply(state, delta.diff(old, new, version=2, base_version=1)); "
            "assert torch.equal(state['w'], new['w']); print('ok')")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", code], cwd=tmp_path, env=clean, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    help_text = subprocess.run([str(env_dir / "bin" / "delta"), "--help"], cwd=tmp_path, env=clean,
                               capture_output=True, text=True, timeout=300)
    assert help_text.returncode == 0 and "inspect" in help_text.stdout, help_text.stderr[-2000:]
