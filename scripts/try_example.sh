#!/usr/bin/env bash
# The user's command after `bash scripts/install.sh --with BACKEND`: `rollart train EXAMPLE`
# with that install's python, shortened to a few steps, in a throw-away output directory.
# Fails unless the run ends with its summary and a final checkpoint. Called by the heavy
# suites' ci.sh scripts (vllm, megatron, mooncake), so a fresh clone's install is known to
# run its example with no other step.
#   bash scripts/try_example.sh PYTHON examples/vllm.yaml [STEPS]
set -euo pipefail
py="${1:?python of the install}"; example="${2:?example config}"; steps="${3:-2}"
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mktemp -d "${TMPDIR:-/tmp}/rollart-example-XXXXXX")"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
t0=$(date +%s)
cd "$root"
log="$out/train.log"
if ! timeout 600 "$(dirname "$py")/rollart" train "$example" "train.steps=$steps" \
     "output_dir=$out" > "$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "FAILED: rollart train $example (log above, whole log: $log)" >&2
  exit 1
fi
run="$(find "$out" -mindepth 1 -maxdepth 1 -type d ! -name '.*' | head -n 1)"
if [ -z "$run" ] || [ ! -f "$run/summary.json" ] || [ ! -d "$run/checkpoints/step-$steps" ] || [ ! -d "$run/final_model" ]; then
  tail -n 40 "$log" >&2
  echo "FAILED: rollart train $example ended without summary.json, checkpoints/step-$steps and final_model/ in $out" >&2
  exit 1
fi
echo "example ok: rollart train $example train.steps=$steps in $(( $(date +%s) - t0 )) s ($run)"
rm -rf "$out"
