#!/usr/bin/env bash
# The GPU check of the embedded backends, run on a machine with one CUDA device and the
# packages of a CUDA PyTorch image (torch, transformers, safetensors, pluggy, PyYAML, rich,
# pytest) but no network: the missing wheels travel in .whl/ (pydantic, pydantic-core,
# annotated-types, typing-inspection, gymnasium, farama-notifications, megatron-core; see
# docs/trainers.md). Results go to $OUT (default ./device-out).
#   bash scripts/device_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/device-out}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PIP_ROOT_USER_ACTION=ignore
pip_offline() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$@"; }
rm -rf /tmp/rollart-site /tmp/rollart-sdk build  # a warm machine keeps the last run's copies
pip_offline --target /tmp/rollart-site .whl/*.whl || exit 1
pip_offline --no-build-isolation --target /tmp/rollart-sdk . \
  plugins/engines/rollart-engine-torch plugins/trainers/rollart-trainer-torch \
  plugins/trainers/rollart-trainer-megatron plugins/envs/rollart-env-frozenlake \
  plugins/envs/rollart-env-arithmetic plugins/rewards/rollart-reward-rule || exit 1
export PYTHONPATH=/tmp/rollart-sdk:/tmp/rollart-site
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"

echo "== tests/gpu"
timeout 200 python3 -m pytest -q -rs tests/gpu 2>&1 | grep -v "Loading weights\|Writing model" \
  | tee "$OUT/gpu_tests.log"
echo "== trainer step times"
timeout 150 python3 scripts/device_bench.py --json "$OUT/trainers.json" --cpu-repeats 1 2>&1 \
  | grep -v "Loading weights\|Writing model" | tee "$OUT/trainers.log"
engine=(python3 -c "import sys; from rollart_engine_torch.bench import main; sys.exit(main(sys.argv[1:]))"
  --hidden 768 --layers 12 --heads 12 --intermediate 3072 --vocab 32000 --batch 32
  --output-len 32 256 --repeats 1)
echo "== engine tokens/s, cuda"
timeout 90 "${engine[@]}" --requests 64 --device cuda --json "$OUT/engine_cuda.json" 2>&1 | tail -9
echo "== engine tokens/s, cpu ($(nproc) threads)"
timeout 90 "${engine[@]}" --requests 32 --device cpu --threads "$(nproc)" \
  --json "$OUT/engine_cpu.json" 2>&1 | tail -9
