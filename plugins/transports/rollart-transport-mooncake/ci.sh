#!/usr/bin/env bash
# Tests of transport "mooncake" in a venv of its own: Mooncake's TCP build
# (mooncake-transfer-engine-non-cuda, which ships mooncake_master) and the Debian libraries
# it links against, next to the CPU torch pinned by the repo's constraints.txt.
#   bash plugins/transports/rollart-transport-mooncake/ci.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${ROLLART_MOONCAKE_VENV:-${TMPDIR:-/tmp}/rollart-ci-mooncake}"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore OMP_NUM_THREADS=1 MC_TCP_BIND_ADDRESS=127.0.0.1
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
# The user's install: scripts/install.sh --with mooncake (the Debian libraries through
# apt-get, Mooncake's TCP build, this plugin, and the SDK with the light plugins the
# pipeline test runs: the torch engine and trainer, two envs and the rule reward).
PYTHON="$venv/bin/python" bash "$root/scripts/install.sh" --with mooncake
"$venv/bin/python" -c "import pytest, pytest_timeout" 2>/dev/null || "$venv/bin/python" -m pip \
  install --quiet --disable-pip-version-check -c "$root/constraints.txt" pytest pytest-timeout
cd "$root"
# The user's next command after that install, shortened: rollart train examples/mooncake.yaml.
bash "$root/scripts/try_example.sh" "$venv/bin/python" examples/mooncake.yaml 2
exec timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests" "$@"
