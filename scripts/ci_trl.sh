#!/usr/bin/env bash
# The tests of `rollart bench small --modes trl`
# (plugins/benchmarks/rollart-benchmark-suite/tests/test_small_trl.py): Hugging Face TRL's
# real GRPOTrainer against the plain-torch reference, in a venv of its own
# (ROLLART_TRL_VENV, default ${TMPDIR:-/tmp}/rollart-ci-trl, kept between runs) that sees
# the core environment's packages (--system-site-packages) and adds trl==1.16.0 (TRL is not
# a rollart dependency). If the venv cannot be installed the suite fails with the reason
# (ROLLART_ALLOW_HEAVY_SKIP=1: skipped instead).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
venv="${ROLLART_TRL_VENV:-${TMPDIR:-/tmp}/rollart-ci-trl}"
t0=$(date +%s)
[ -x "$venv/bin/python" ] || "$py" -m venv --system-site-packages "$venv"
vpy="$venv/bin/python"
if ! "$vpy" - "$root" <<'PY' 2>/dev/null
import sys, importlib.metadata as md, rollart_sdk, pytest  # noqa
assert rollart_sdk.__file__.startswith(sys.argv[1]) and md.version("trl") == "1.16.0"
PY
then
  if ! "$vpy" -m pip install --quiet -c "$root/constraints.txt" "trl==1.16.0"; then
    echo "FAILED: trl==1.16.0 could not be installed in $venv (see pip's error above)." \
         "ROLLART_ALLOW_HEAVY_SKIP=1 turns this into a skip." >&2
    [ "${ROLLART_ALLOW_HEAVY_SKIP:-0}" = "1" ] && exit 0
    exit 1
  fi
fi
echo "trl venv ready in $(( $(date +%s) - t0 )) s: $("$vpy" -c 'from importlib.metadata import version as v; print("trl", v("trl"), "transformers", v("transformers"), "torch", v("torch"))')"
cd "$root"
# The suite must not skip here: trl is installed.
log="$venv/last-test.log"
"$vpy" -m pytest -q -x plugins/benchmarks/rollart-benchmark-suite/tests/test_small_trl.py -p no:cacheprovider -rs "$@" | tee "$log"
if grep -q "skipped" "$log"; then
  echo "FAILED: tests were skipped in the trl venv (see the reasons above)" >&2; exit 1
fi
