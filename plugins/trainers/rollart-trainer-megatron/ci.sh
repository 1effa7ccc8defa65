#!/usr/bin/env bash
# Tests of trainer "megatron" in a venv of its own, installed by `scripts/install.sh --with
# megatron`: megatron-core 0.16.1 next to the CPU torch (pinned by the repo's constraints.txt),
# the core, the light plugins (trainer "torch": the equivalence tests compare against it)
# and this plugin. Reuses pip's cache; a few minutes on 2 cores.
#   bash plugins/trainers/rollart-trainer-megatron/ci.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${ROLLART_MEGATRON_VENV:-${TMPDIR:-/tmp}/rollart-ci-megatron}"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore OMP_NUM_THREADS=1
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
# The user's install: scripts/install.sh --with megatron (the SDK, the light plugins that
# examples/megatron.yaml and the equivalence tests use, megatron-core 0.16.1, this plugin).
PYTHON="$venv/bin/python" bash "$root/scripts/install.sh" --with megatron
"$venv/bin/python" -c "import pytest, pytest_timeout" 2>/dev/null || "$venv/bin/python" -m pip \
  install --quiet --disable-pip-version-check -c "$root/constraints.txt" pytest pytest-timeout
cd "$root"
"$venv/bin/python" -m rollart_sdk.cli validate examples/megatron.yaml
# The user's next command after that install, shortened: rollart train examples/megatron.yaml.
bash "$root/scripts/try_example.sh" "$venv/bin/python" examples/megatron.yaml 2
exec timeout 1200 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests" "$@"
