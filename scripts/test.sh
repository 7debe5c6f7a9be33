#!/usr/bin/env bash
# Install everything the test suite needs on a fresh machine, then run it.
# This is the README's test command and exactly what .ci/run calls: ruff and mypy (scripts/quality.sh), then pytest.
# What it installs, and where:
#   pip: requirements-test.txt (the apps' requirements and the test tools; torch pinned to its CPU build by
#        constraints.txt) into the Python that runs this script: an active virtualenv's, else the interpreter's;
#   apt: Debian's chromium, only where /usr/bin/chromium is missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh -r requirements-test.txt
# Debian's chromium for the browser test (tests/test_env_ui.py): Playwright drives it; nothing
# downloads a browser of its own (never run `playwright install`).
if [ ! -x /usr/bin/chromium ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium < /dev/null
fi
# Lint, format and types first (scripts/quality.sh): a finding fails the run before the tests (tests/README.md says
# how long they take). The 25 slowest tests are printed at the end, so the next slow one is seen the day it comes.
bash scripts/quality.sh
python -m pytest -q --durations=25 "$@"
