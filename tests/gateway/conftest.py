"""Shared by the gateway tests: the tiny model the torch engine serves behind the gateway,
and this folder on sys.path for ``gateway_parts`` (pytest runs with
``--import-mode=importlib``, which does not put test folders there)."""

from __future__ import annotations

import os
import sys

import pytest

from rollart_sdk.config import ModelConfig, TinyModelConfig
from rollart_sdk.models import prepare_model

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

TINY = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> ModelConfig:
    return prepare_model(ModelConfig(tiny=TINY), tmp_path_factory.mktemp("models"), [])
