#!/usr/bin/env bash
# Tests of trainer "megatron" in a venv of its own: megatron-core 0.16.1 next to the CPU torch
# (pinned by the repo's constraints.txt), the core, trainer "torch" (the equivalence tests
# compare against it) and this plugin. Reuses pip's cache; a few minutes on 2 cores.
#   bash plugins/trainers/rollart-trainer-megatron/ci.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${ROLLART_MEGATRON_VENV:-${TMPDIR:-/tmp}/rollart-ci-megatron}"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore OMP_NUM_THREADS=1
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$root/constraints.txt" "$@"
}
"$venv/bin/python" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install "megatron-core==0.16.1" pytest
pip_install -e "$root[hf]" -e "$root/plugins/trainers/rollart-trainer-torch" -e "$here"
# examples/megatron.yaml's other backends (light plugins), so that it is validated here:
# the core suite skips it (no megatron-core there).
pl="$root/plugins"
pip_install -e "$pl/engines/rollart-engine-torch" -e "$pl/envs/rollart-env-frozenlake" \
  -e "$pl/envs/rollart-env-arithmetic" -e "$pl/rewards/rollart-reward-rule" \
  -e "$pl/transports/rollart-transport-ray"
cd "$root"
"$venv/bin/python" -m rollart_sdk.cli validate examples/megatron.yaml
exec timeout 1200 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests" "$@"
