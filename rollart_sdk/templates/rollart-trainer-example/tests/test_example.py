import pytest
import rollart_trainer_example.plugin as plugin
import torch
from rollart_trainer_example.trainer import ExampleTrainer

from rollart_sdk.algorithms import token_logprobs
from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import build_tiny_checkpoint, load_causal_lm
from rollart_sdk.testing.trainer import check_trainer
from rollart_sdk.types import TrainSample


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return ModelConfig(path=build_tiny_checkpoint(tiny, tmp_path_factory.mktemp("tiny")))


def _batch(model):
    """Two groups of two trajectories with the starting model's log-probs, as a rollout
    would record them; rewards differ within each group (a learning signal)."""
    lm = load_causal_lm(model.path)
    batch = []
    for g, (prompt, actions) in enumerate([([5, 6, 7], ([8, 9], [10, 11])),
                                           ([12, 13], ([14, 15, 16], [17, 18, 19]))]):
        for reward, action in zip((1.0, 0.0), actions, strict=True):
            ids = prompt + list(action)
            with torch.no_grad():
                t = torch.tensor([ids])
                lps = [0.0] + token_logprobs(lm(input_ids=t).logits, t)[0].tolist()
            mask = [0] * len(prompt) + [1] * len(action)
            batch.append(TrainSample(ids, mask, [lp * m for lp, m in zip(lps, mask, strict=True)],
                                     [-1] * len(prompt) + [0] * len(action), reward, f"g{g}"))
    return batch


def test_conforms(model):
    report = check_trainer(lambda: ExampleTrainer(model=model, lr=1e-2), _batch(model),
                           bucket_bytes=8192)
    assert report["loss_after"] < report["loss_before"]


def test_registers(register_plugin, model):
    desc = register_plugin(plugin).registry.get("trainer", "example")
    assert desc.create({"lr": 0.01}, model=model, rank=0, world_size=1).version == 0
