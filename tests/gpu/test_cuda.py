"""The embedded backends on a CUDA device: conformance kits and an in-process run.

Skipped (with the reason printed by ``pytest -rs``) where no CUDA device is present, which
is every CI run of this project; run on a GPU machine with ``python -m pytest tests/gpu``.
``ROLLART_TEST_DEVICE=cpu`` runs the same tests on the CPU (to check the tests themselves).

What they show on a GPU: engine ``torch`` and trainer ``torch`` (and trainer ``megatron``
where megatron-core is installed) pass the SDK's conformance kits with their tensors on
the device; engine log-probs computed on the GPU equal a CPU float32 forward within 1e-4;
a whole two-task run (control plane, envs, rewards, local transport) trains on the device.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

DEVICE = os.environ.get("ROLLART_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
pytestmark = pytest.mark.skipif(
    not DEVICE, reason="no CUDA device here (set ROLLART_TEST_DEVICE=cpu to run on the CPU)"
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "control"))
from control_configs import TWO_TASKS  # noqa: E402

from rollart_sdk.config import ModelConfig, TinyModelConfig, load_config  # noqa: E402

TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128, seed=0)
ACTIONS = ["Left", "Right", "Up", "Down"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    from rollart_sdk.models import prepare_model

    return prepare_model(ModelConfig(tiny=TINY), tmp_path_factory.mktemp("m"), ACTIONS)


def _cpu_logprobs(path: str, prompt: list[int], tokens: list[int]) -> list[float]:
    from rollart_sdk.models import load_causal_lm

    model = load_causal_lm(path)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def test_torch_engine_conformance_on_device(tiny: ModelConfig, tmp_path: Path) -> None:
    from rollart_engine_torch.engine import TorchEngine

    from rollart_sdk.models import load_causal_lm, load_tokenizer, prepare_model
    from rollart_sdk.testing.engine import check_engine
    from rollart_sdk.weights import split_buckets

    assert tiny.path is not None
    tok = load_tokenizer(tiny.path)
    other = prepare_model(ModelConfig(tiny=TINY.model_copy(update={"seed": 1})), tmp_path, ACTIONS)
    assert other.path is not None
    other_weights = {k: v.clone() for k, v in load_causal_lm(other.path).state_dict().items()}
    path = tiny.path
    report = check_engine(
        lambda: TorchEngine(model=tiny, max_running=8, max_seq_len=1024, device=DEVICE),
        tokenizer_vocab_size=len(tok),
        reference_logprobs=lambda p, t: _cpu_logprobs(path, p, t),
        update_buckets=lambda v: split_buckets(other_weights.items(), bucket_bytes=64_000,
                                               version=v),
        prompt_ids=tok.encode("You are on a frozen lake. Move:"),
        eos_token_ids=[tok.eos_token_id],
    )
    assert report["skipped"] == []
    assert report["stats"]["recomputed"] >= 1


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollart_sdk.testing.trainer import tiny_llama_checkpoint

    return tiny_llama_checkpoint(tmp_path_factory.mktemp("llama"))


def test_torch_trainer_conformance_on_device(ckpt: Path) -> None:
    from rollart_trainer_torch.trainer import TorchTrainer

    from rollart_sdk.testing.trainer import check_trainer, toy_batch

    report = check_trainer(
        lambda: TorchTrainer(model=ModelConfig(path=str(ckpt)), lr=1e-3, micro_batch_size=4,
                             seed=0, device=DEVICE),
        toy_batch(ckpt), bucket_bytes=8192,
        # GPU kernels may reduce in a different order after a reload: not bit-identical.
        resume_atol=1e-6 if DEVICE.startswith("cuda") else 0.0,
    )
    assert report["loss_after"] < report["loss_before"]
    # behaviour log-probs came from a CPU forward: trainer numerics on the device agree
    assert report["metrics"]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("distopt", [pytest.param(False, id="adamw"),
                                     pytest.param(True, id="distributed-optimizer")])
def test_megatron_trainer_conformance_on_device(ckpt: Path, distopt: bool) -> None:
    """Megatron's schedule (no pipelining) and, with ``distopt``, the plugin's distributed
    optimizer (one DP rank: its flat master range, NCCL world of one) on the device."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed here")
    pytest.importorskip("rollart_trainer_megatron", reason="trainer megatron is not installed")
    from rollart_trainer_megatron.trainer import MegatronTrainer

    from rollart_sdk.testing.trainer import check_trainer, toy_batch

    report = check_trainer(
        lambda: MegatronTrainer(model=ModelConfig(path=str(ckpt)), lr=1e-3, seed=0,
                                device=DEVICE, use_distributed_optimizer=distopt),
        toy_batch(ckpt), bucket_bytes=8192, resume_atol=1e-6 if DEVICE.startswith("cuda") else 0.0,
    )
    assert report["loss_after"] < report["loss_before"]
    assert report["metrics"]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)


def test_two_task_run_on_device(tmp_path: Path) -> None:
    """The whole control plane in-process with engine and trainer on the device."""
    from rollart_sdk.job import build_job, run_job

    data: dict[str, Any] = copy.deepcopy(TWO_TASKS)
    data["engine"]["options"]["device"] = DEVICE
    data["trainer"]["options"]["device"] = DEVICE
    cfg, lines = load_config(data=data, overrides=[f"output_dir={tmp_path}", "train.steps=4"])
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        model = job.trainers[0].target.trainer.model
        assert next(model.parameters()).device.type == DEVICE.split(":")[0]
        engines = [h.target.engine for h in job.pipeline.proxy.workers.values()]
        assert {e._runner.device.type for e in engines} == {DEVICE.split(":")[0]}
        records = run_job(job, 4, progress=False)
    finally:
        job.close()
    assert [r.step for r in records] == [0, 1, 2, 3]
    assert all(len(r.batch) == 8 for r in records)
    lines_out = (job.run_dir.path / "metrics.jsonl").read_text().splitlines()
    losses = [json.loads(x).get("train/loss") for x in lines_out]
    assert len([x for x in losses if x is not None]) == 4
    assert all(math.isfinite(x) for x in losses if x is not None)
