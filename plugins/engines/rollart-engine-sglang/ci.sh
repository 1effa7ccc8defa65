#!/usr/bin/env bash
# Tests of rollart-engine-sglang. SGLang 0.5.23 pins torch 2.14.1 and CUDA kernels, so on a
# machine without an NVIDIA GPU the adapter runs against the recorded-contract stand-in
# (tests/sglang_contract.py), and the contract itself is checked against the source of the
# real 0.5.23 wheel (downloaded with --no-deps, parsed, never imported). See README.md.
# On a GPU machine with sglang==0.5.23 installed, ROLLART_SGLANG_REAL=1 runs the same kit
# on the real engine.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
py="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
src="${ROLLART_SGLANG_SRC:-${TMPDIR:-/tmp}/rollart-sglang-0.5.23}"
if [ ! -f "$src/sglang/srt/entrypoints/engine.py" ]; then
  mkdir -p "$src"
  "$py" -m pip download --quiet --no-deps "sglang==0.5.23" -d "$src/wheel"
  "$py" -m zipfile -e "$src"/wheel/sglang-0.5.23-*.whl "$src"
fi
"$py" -c "import rollart_engine_sglang" 2>/dev/null || "$py" -m pip install --quiet -e "$here"
cd "$root"
ROLLART_SGLANG_SRC="$src" "$py" -m pytest -q -x "$here/tests" -p no:cacheprovider "$@"
