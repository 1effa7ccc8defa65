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
cd "$root"
exec timeout 1200 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests" "$@"
