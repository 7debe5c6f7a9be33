#!/usr/bin/env bash
# The main job: install, then `python app.py` — the Wordle env, the rollout server and the trainer as
# three local processes on one bucket (.cache/bucket), a landing page at http://127.0.0.1:7860, the
# offline SmolLM2-135M-Instruct (converted once). Ctrl-C stops all three; run it again to resume.
# Arguments go to app.py (e.g. `bash scripts/demo.sh --engine vllm`; see `python app.py all --help`).
#
# `bash scripts/demo.sh delta` runs the codec walk-through instead: real SmolLM2-135M checkpoints from
# AdamW steps at an RL learning rate, turned into deltas with the TRL layout and with the default
# codec, applied and verified bit for bit; everything lands in .cache/demo (or $DEMO_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
if [ "${1:-}" != "delta" ]; then
    exec python app.py "$@"
fi
out="${DEMO_DIR:-.cache/demo}"
ckpt="$out/checkpoints"
mkdir -p "$out"

echo "== 1. Two AdamW steps of SmolLM2-135M at lr 1e-6, published as bf16 (cached after the first run)"
python -m bench.checkpoints --data smollm2-bf16 --steps 2 --lr 1e-6 -o "$ckpt"

for v in 1 2; do
    base="$ckpt/step_000$((v - 1)).safetensors"
    target="$ckpt/step_000$v.safetensors"
    echo "== 2.$v Version $v: the delta in the TRL layout (raw) and with the default codec (ctx)"
    python -m delta diff "$base" "$target" --codec raw --version "$v" --base-version "$((v - 1))" -o "$out/v$v.raw.delta"
    python -m delta diff "$base" "$target" --version "$v" --base-version "$((v - 1))" -o "$out/v$v.delta"
done

echo "== 3. What version 2 holds"
python -m delta inspect "$out/v2.delta" --limit 8

echo "== 4. A reader at version 0 applies both deltas and checks the hashes"
python -m delta apply "$ckpt/step_0000.safetensors" "$out/v1.delta" -o "$out/reader_v1.safetensors"
python -m delta apply "$out/reader_v1.safetensors" "$out/v2.delta" -o "$out/reader_v2.safetensors"
python -m delta verify "$out/v2.delta" --base "$out/reader_v1.safetensors"
python - "$out/reader_v2.safetensors" "$ckpt/step_0002.safetensors" <<'PY'
import sys
import delta
a, b = (delta.load_state(p) for p in sys.argv[1:])
assert delta.state_digest(a).hexdigest == delta.state_digest(b).hexdigest, "reader differs from the trainer"
print(f"reader at version 2 is bit-identical to the trainer's published state ({len(a)} tensors)")
PY
ls -l "$out"/*.delta
