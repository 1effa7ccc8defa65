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
debs=(libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200)
missing=()
for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
pip_install() {
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -c "$root/constraints.txt" "$@"
}
"$venv/bin/python" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
pip_install "mooncake-transfer-engine-non-cuda>=0.3.13" pytest pytest-timeout
# The pipeline test (test_mooncake_pipeline.py) runs the real training loop: the torch
# engine and trainer, two envs and the rule reward, all light plugins of this repo.
pip_install -e "$root" -e "$here" \
  -e "$root/plugins/engines/rollart-engine-torch" \
  -e "$root/plugins/trainers/rollart-trainer-torch" \
  -e "$root/plugins/envs/rollart-env-frozenlake" \
  -e "$root/plugins/envs/rollart-env-arithmetic" \
  -e "$root/plugins/rewards/rollart-reward-rule"
cd "$root"
exec timeout 900 "$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests" "$@"
