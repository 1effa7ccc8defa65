import rollart_engine_example.plugin as plugin
import torch
from rollart_engine_example.engine import ExampleEngine, bigram_logits, initial_table

from rollart_sdk.testing.engine import check_engine
from rollart_sdk.weights import split_buckets


def test_conforms():
    table = initial_table(64, 0)
    report = check_engine(
        lambda: ExampleEngine(vocab_size=64, seed=0),
        tokenizer_vocab_size=64,
        reference_logits=lambda prompt, tokens: bigram_logits(table, prompt, tokens),
        update_buckets=lambda version: split_buckets(
            [("table", torch.randn(64, 64))], 1 << 20, version),
    )
    assert not report["skipped"]


def test_registers(register_plugin):
    desc = register_plugin(plugin).registry.get("engine", "example")
    assert desc.create({"vocab_size": 8}, model=None).vocab == 8
