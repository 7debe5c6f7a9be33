#!/usr/bin/env bash
# Lint, format and types over the code outside tests/, as pyproject.toml configures them: ruff's checks, ruff's
# format check and mypy. scripts/test.sh runs this before the tests; it runs alone too. The tools are the ones
# installed in the Python that runs it (requirements-test.txt pins them): an active virtualenv's, else the
# interpreter's. Stops at the first tool that finds something, saying how to see or fix it; mypy reads nothing
# from the network (its stubs come with the packages installed).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "scripts/quality.sh: $1" >&2
    exit 1
}

python -m ruff --version >/dev/null 2>&1 && python -m mypy --version >/dev/null 2>&1 \
    || fail "ruff or mypy is not installed in $(command -v python): pip install -r requirements-test.txt -c constraints.txt"
python -m ruff check . \
    || fail "ruff check found the problems above (python -m ruff check --fix . fixes the ones marked [*])"
python -m ruff format --check . \
    || fail "the files above are not formatted: python -m ruff format ."
python -m mypy \
    || fail "mypy found the type errors above (its settings: [tool.mypy] in pyproject.toml)"
echo "quality: ruff check, ruff format --check and mypy clean"
