"""Shared fixtures: a tiny Llama checkpoint, a second set of weights, HF reference logprobs.

vLLM takes 15-40 s to start, so each test module shares one engine (``module_engine``)
driven on one event loop of its own (``run``): vLLM's output handler is bound to the loop
it first ran on.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import pytest
import torch

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import load_causal_lm, prepare_model

os.environ.setdefault("OMP_NUM_THREADS", "1")

# head_dim 32: a size vLLM's CPU attention kernels support.
TINY = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0)
ACTIONS = ["Left", "Right", "Up", "Down"]


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    return prepare_model(ModelConfig(tiny=TINY), tmp_path_factory.mktemp("models"), ACTIONS)


@pytest.fixture(scope="session")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    """Same architecture, different seed: a 'new policy version'."""
    return prepare_model(
        ModelConfig(tiny=TINY.model_copy(update={"seed": 1})),
        tmp_path_factory.mktemp("models2"),
        ACTIONS,
    )


@pytest.fixture(scope="session")
def other_weights(other_model: ModelConfig) -> dict[str, torch.Tensor]:
    assert other_model.path is not None
    return {k: v.clone() for k, v in load_causal_lm(other_model.path).state_dict().items()}


def make_reference(path: str) -> Callable[..., list[float]]:
    """Teacher-forced logprobs of a checkpoint under the sampled policy (``allowed`` ids,
    ``temperature``; the raw distribution by default): what the trainer recomputes."""
    from rollart_sdk.algorithms import policy_logprob

    model = load_causal_lm(path)

    def logprobs(prompt: list[int], tokens: list[int], allowed: list[int] | None = None,
                 temperature: float = 1.0) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        mask = torch.tensor(allowed) if allowed is not None else None
        return [policy_logprob(logits[len(prompt) - 1 + i], t, temperature, mask)
                for i, t in enumerate(tokens)]

    return logprobs


@pytest.fixture(scope="session")
def reference(tiny_model: ModelConfig):
    assert tiny_model.path is not None
    return make_reference(tiny_model.path)


@pytest.fixture(scope="session")
def reference_logits(tiny_model: ModelConfig):
    """Teacher-forced logits of the initial weights (the kit's sampled-policy check)."""
    from rollart_sdk.testing.engine import teacher_forced_logits

    assert tiny_model.path is not None
    return teacher_forced_logits(load_causal_lm(tiny_model.path))


@pytest.fixture(scope="session")
def other_reference(other_model: ModelConfig):
    assert other_model.path is not None
    return make_reference(other_model.path)


@pytest.fixture(scope="module")
def loop():
    lp = asyncio.new_event_loop()
    yield lp
    lp.close()


@pytest.fixture(scope="module")
def module_engine(tiny_model, loop):
    from rollart_engine_vllm.engine import VllmEngine

    engine = VllmEngine(model=tiny_model, max_model_len=1024, max_num_seqs=16,
                        cpu_kv_cache_gb=0.25)
    yield engine
    loop.run_until_complete(asyncio.wait_for(engine.shutdown(), 120))
