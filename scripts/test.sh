#!/usr/bin/env bash
# The test command (README, .ci/run): install, lint (ruff), type-check (mypy), the core +
# light plugins' tests (and examples/), then
# every heavy suite (a plugin folder with a ci.sh installs its own stack into its own
# venv, reusing pip's cache, and runs its tests there; scripts/ci_trl.sh: the benchmark's
# TRL baseline, likewise).
#   bash scripts/test.sh            # everything
#   ROLLART_SKIP_HEAVY=1 bash scripts/test.sh   # core and light plugins only
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
start=$(date +%s)
bash scripts/install.sh --dev || exit 1
ruff check . || exit 1
"$PY" -m mypy || exit 1   # [tool.mypy] in pyproject.toml: rollart_sdk and the plugin packages
# Two test processes (pytest-xdist): many tests wait on Ray, subprocesses and sleeps, so
# two share the 2 cores well (core suite about 16-19 min instead of about 30 on this machine).
# --durations: the slowest tests in the log, where to cut when the run nears its budget
# (CI: 45 minutes).
"$PY" -m pytest -q -n "${ROLLART_TEST_WORKERS:-2}" --durations=30 || exit 1
echo "core suite: $(( $(date +%s) - start )) s"
failed=()
if [ "${ROLLART_SKIP_HEAVY:-0}" != "1" ]; then
  for ci in plugins/*/*/ci.sh scripts/ci_trl.sh; do
    [ -f "$ci" ] || continue
    t0=$(date +%s)
    echo "== heavy suite: $ci"
    if bash "$ci"; then echo "== $ci passed in $(( $(date +%s) - t0 )) s"
    else echo "== $ci FAILED after $(( $(date +%s) - t0 )) s"; failed+=("$ci"); fi
  done
fi
echo "total: $(( $(date +%s) - start )) s"
if [ "${#failed[@]}" -gt 0 ]; then echo "failed heavy suites: ${failed[*]}"; exit 1; fi
