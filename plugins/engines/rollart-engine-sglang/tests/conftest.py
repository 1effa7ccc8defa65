"""Fixtures: a tiny Llama checkpoint, other weights, reference logprobs, and - where the
real SGLang 0.5.23 is not importable - the recorded-contract stand-in registered as the
``sglang`` modules the adapter imports (tests only; see sglang_contract.py)."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Callable

import pytest
import torch

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import load_causal_lm, prepare_model

TINY = TinyModelConfig(hidden_size=48, num_layers=2, num_heads=4, intermediate_size=96, seed=0)
ACTIONS = ["Left", "Right", "Up", "Down"]
REAL_SGLANG = importlib.util.find_spec("sglang") is not None and os.environ.get(
    "ROLLART_SGLANG_REAL") == "1"


def _install_contract() -> None:
    path = os.path.join(os.path.dirname(__file__), "sglang_contract.py")
    spec = importlib.util.spec_from_file_location("rollart_sglang_contract", path)
    assert spec is not None and spec.loader is not None
    contract = importlib.util.module_from_spec(spec)
    sys.modules["rollart_sglang_contract"] = contract
    spec.loader.exec_module(contract)
    for name in ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.utils"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["sglang"].Engine = contract.Engine  # type: ignore[attr-defined]
    sys.modules["sglang.srt.managers.io_struct"] = contract  # type: ignore[assignment]
    sys.modules["sglang.srt.utils.common"] = contract  # type: ignore[assignment]


def _expose_scheduler_plugin() -> None:
    """The collective path needs this plugin's ``sglang.srt.plugins`` entry point, which
    ``pip install -e`` of this checkout registers (ci.sh's install does). A venv whose
    rollart-engine-sglang was installed from an older checkout lacks it: this makes it
    visible with a ``.dist-info`` of its own on ``sys.path`` (SGLang's spawned scheduler
    inherits ``sys.path``), the same metadata the pyproject declares. Tests only."""
    from importlib.metadata import entry_points

    if any(ep.value.startswith("rollart_engine_sglang.scheduler")
           for ep in entry_points(group="sglang.srt.plugins")):
        return
    import atexit
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="rollart-sglang-ep-")
    atexit.register(shutil.rmtree, root, True)
    info = os.path.join(root, "rollart_engine_sglang_scheduler_ep-0.0.0.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as fh:
        fh.write("Metadata-Version: 2.1\nName: rollart-engine-sglang-scheduler-ep\n"
                 "Version: 0.0.0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as fh:
        fh.write("[sglang.srt.plugins]\nrollart = rollart_engine_sglang.scheduler:register\n")
    sys.path.append(root)


if not REAL_SGLANG:
    _install_contract()
else:
    _expose_scheduler_plugin()


@pytest.fixture(scope="session", autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    return prepare_model(ModelConfig(tiny=TINY), tmp_path_factory.mktemp("models"), ACTIONS)


@pytest.fixture(scope="session")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    """Same architecture, different seed: a 'new policy version'."""
    return prepare_model(ModelConfig(tiny=TINY.model_copy(update={"seed": 1})),
                         tmp_path_factory.mktemp("models2"), ACTIONS)


@pytest.fixture(scope="session")
def other_weights(other_model: ModelConfig) -> dict[str, torch.Tensor]:
    assert other_model.path is not None
    return {k: v.clone() for k, v in load_causal_lm(other_model.path).state_dict().items()}


def _reference(path: str | None) -> Callable[[list[int], list[int]], list[float]]:
    """Teacher-forced log-probs (raw distribution) of a checkpoint's tokens."""
    assert path is not None
    model = load_causal_lm(path)

    def logprobs(prompt: list[int], tokens: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]

    return logprobs


@pytest.fixture(scope="session")
def reference(tiny_model: ModelConfig) -> Callable[[list[int], list[int]], list[float]]:
    return _reference(tiny_model.path)


@pytest.fixture(scope="session")
def other_reference(other_model: ModelConfig) -> Callable[[list[int], list[int]], list[float]]:
    return _reference(other_model.path)


@pytest.fixture(scope="session")
def reference_logits(tiny_model: ModelConfig):
    """Teacher-forced logits of the initial weights (the kit's sampled-policy check)."""
    from rollart_sdk.testing.engine import teacher_forced_logits

    assert tiny_model.path is not None
    return teacher_forced_logits(load_causal_lm(tiny_model.path))
