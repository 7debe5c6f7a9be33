#!/usr/bin/env bash
# Check the API surface the `delta` vLLM backend and its senders use (delta/integrations/vllm_surface.py) against
# vLLM releases' source: each release's wheel is downloaded with pip (no dependencies, nothing installed) and read
# with `ast`, so GPU-only releases are checked on any machine. Exit status 1 if a release does not fit; the findings
# say what changed. docs/delta.md holds the last output.
#
#   bash scripts/check_vllm_api.sh              # every series delta_vllm_plugin.CHECKED_VLLM accepts (X.Y.0)
#   bash scripts/check_vllm_api.sh 0.35.0 0.22.0
#
# Wheels are kept in $VLLM_WHEELS (default ~/.cache/delta/vllm-wheels): about 300 MB each.
set -euo pipefail
cd "$(dirname "$0")/.."
cache=${VLLM_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/delta/vllm-wheels}
releases=("$@")
if [ ${#releases[@]} -eq 0 ]; then
    # Read the window from the plugin's source (importing it would import vLLM, where installed).
    mapfile -t releases < <(python - <<'PY'
import ast, pathlib
tree = ast.parse(pathlib.Path("delta_vllm_plugin/__init__.py").read_text())
table = next(n.value for n in ast.walk(tree) if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "CHECKED_VLLM")
print("\n".join(f"{series}.0" for series in ast.literal_eval(table)))
PY
)
fi
wheels=()
for release in "${releases[@]}"; do
    mkdir -p "$cache/$release"
    if ! ls "$cache/$release"/vllm-"$release"-*.whl >/dev/null 2>&1; then
        python -m pip download --quiet --no-deps --only-binary=:all: "vllm==$release" -d "$cache/$release"
    fi
    wheels+=("$(ls "$cache/$release"/vllm-"$release"-*.whl | head -n 1)")
done
echo "checked $(date -u +%F) against the vLLM wheels on PyPI: ${releases[*]}"
python -m delta.integrations.vllm_surface --quiet "${wheels[@]}"
