"""Shared fixtures: one tiny Llama checkpoint per session, and its reference forward."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import load_causal_lm, prepare_model

TINY = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, intermediate_size=96, seed=0)
ACTIONS = ["Left", "Right", "Up", "Down"]


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    return prepare_model(ModelConfig(tiny=TINY), tmp_path_factory.mktemp("models"), ACTIONS)


@pytest.fixture(scope="session")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    """The same architecture, another seed: a 'new policy version'."""
    other = prepare_model(ModelConfig(tiny=TINY.model_copy(update={"seed": 1})),
                          tmp_path_factory.mktemp("models2"), ACTIONS)
    assert other.path is not None
    return other


@pytest.fixture(scope="session")
def other_weights(other_model: ModelConfig) -> dict[str, torch.Tensor]:
    """The new version's weights, as a trainer exports them."""
    assert other_model.path is not None
    return {k: v.clone() for k, v in load_causal_lm(other_model.path).state_dict().items()}


@pytest.fixture(scope="session")
def other_logits(other_model: ModelConfig):
    """Teacher-forced logits of the new version (transformers' forward): what the engine
    must serve once it loaded ``other_weights``."""
    from rollart_sdk.testing.engine import teacher_forced_logits

    assert other_model.path is not None
    return teacher_forced_logits(load_causal_lm(other_model.path, implementation="transformers"))


@pytest.fixture(scope="session")
def reference(tiny_model: ModelConfig) -> Callable[[list[int], list[int]], list[float]]:
    """Teacher-forced logprobs of the initial weights (plain full-vocab log_softmax), from
    transformers' model (independent of the SDK's own forward the engine runs)."""
    assert tiny_model.path is not None
    model = load_causal_lm(tiny_model.path, implementation="transformers")

    def logprobs(prompt: list[int], tokens: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]

    return logprobs


@pytest.fixture(scope="session")
def reference_logits(tiny_model: ModelConfig):
    """Teacher-forced logits of the initial weights (the kit's sampled-policy check),
    from transformers' model (independent of the SDK's own forward the engine runs)."""
    from rollart_sdk.testing.engine import teacher_forced_logits

    assert tiny_model.path is not None
    return teacher_forced_logits(load_causal_lm(tiny_model.path, implementation="transformers"))
