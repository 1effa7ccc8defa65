"""The recorded contract matches SGLang 0.5.23's source, and the adapter keeps its rules.

``ROLLART_SGLANG_SRC`` points at an unpacked ``sglang==0.5.23`` wheel (ci.sh downloads it
with ``pip download --no-deps``); the source is parsed with ``ast``, never imported, so
this runs without SGLang's CUDA stack. Without it these signature tests are skipped with
the reason printed.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import inspect
import os
import sys
from pathlib import Path

import pytest
import torch

SRC = os.environ.get("ROLLART_SGLANG_SRC")
needs_src = pytest.mark.skipif(
    not SRC, reason="ROLLART_SGLANG_SRC (an unpacked sglang==0.5.23 wheel) is not set; "
    "plugins/engines/rollart-engine-sglang/ci.sh sets it"
)


def _tree(rel: str) -> ast.Module:
    assert SRC is not None
    return ast.parse((Path(SRC) / "sglang" / rel).read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"class {name} not found")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"{cls.name}.{name} not found")


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


@needs_src
def test_engine_and_tokenizer_manager_signatures():
    engine = _class(_tree("srt/entrypoints/engine.py"), "Engine")
    gen = _method(engine, "async_generate")
    assert isinstance(gen, ast.AsyncFunctionDef)
    for p in ("prompt", "sampling_params", "input_ids", "return_logprob", "stream", "rid",
              "token_ids_logprob"):
        assert p in _params(gen), f"Engine.async_generate lost {p}"
    _method(engine, "shutdown")
    tm = _class(_tree("srt/managers/tokenizer_manager.py"), "TokenizerManager")
    assert _params(_method(tm, "abort_request")) == ["self", "rid", "abort_all"]
    for name in ("pause_generation", "continue_generation"):
        fn = _method(tm, name)
        assert isinstance(fn, ast.AsyncFunctionDef) and _params(fn) == ["self", "obj"]
    mixin = _class(_tree("srt/managers/tokenizer_control_mixin.py"), "TokenizerControlMixin")
    for name in ("begin_weight_update", "end_weight_update", "update_weights_from_tensor",
                 "update_weights_from_distributed"):
        fn = _method(mixin, name)
        assert isinstance(fn, ast.AsyncFunctionDef) and _params(fn) == ["self", "obj", "request"]
    assert _params(_method(mixin, "flush_cache")) == ["self", "timeout_s"]


@needs_src
def test_request_structs_and_sampling_fields():
    io = _tree("srt/managers/io_struct.py")
    pause = _fields(_class(io, "PauseGenerationReqInput"))
    assert "retract" in pause["mode"] and "in_place" in pause["mode"]
    assert "torch_empty_cache" in _fields(_class(io, "ContinueGenerationReqInput"))
    upd = _fields(_class(io, "UpdateWeightsFromTensorReqInput"))
    assert {"serialized_named_tensors", "load_format", "flush_cache"} <= set(upd)
    _class(io, "BeginWeightUpdateReqInput")
    _class(io, "EndWeightUpdateReqInput")
    assert "success" in _fields(_class(io, "FlushCacheReqOutput"))
    sp = _fields(_class(_tree("srt/sampling/sampling_params.py"), "SamplingParams"))
    for f in ("temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids",
              "ignore_eos", "sampling_seed"):
        assert f in sp, f"SamplingParams lost {f}"
    assert "allowed_token_ids" not in sp  # why constrained requests are sampled by the adapter
    sampler = (Path(SRC or "") / "sglang/srt/layers/sampler.py").read_text()
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" in sampler
    # The default log-probs (the adapter sets the switch to 0) are of the tempered
    # distribution: the sampled policy the trainer recomputes.
    assert "logits.div_(sampling_info.temperatures)" in sampler
    assert "torch.log(probs)" in sampler
    # token_ids_logprob: the requested ids' log-probs per output position, in meta_info
    tm_src = (Path(SRC or "") / "sglang/srt/managers/tokenizer_manager.py").read_text()
    assert 'meta_info["output_token_ids_logprobs"]' in tm_src
    serializer = _class(_tree("srt/utils/common.py"), "MultiprocessingSerializer")
    _method(serializer, "serialize")


@needs_src
def test_collective_path_hooks_exist_in_the_wheel():
    """What the collective path (scheduler.py, collective.py) relies on in 0.5.23: general
    plugins loaded in the scheduler process before the Scheduler is built, the hook
    registry, the RPC handler and socket, and custom weight loaders."""
    root = Path(SRC or "") / "sglang/srt"
    plugins = (root / "plugins/__init__.py").read_text()
    assert 'GENERAL_PLUGINS_GROUP = "sglang.srt.plugins"' in plugins
    assert "HookRegistry.apply_hooks()" in plugins
    sched = _tree("srt/managers/scheduler.py")
    run = next(n for n in ast.walk(sched)
               if isinstance(n, ast.FunctionDef) and n.name == "run_scheduler_process")
    assert ast.unparse(run.body[0]) == "load_plugins()", "plugins no longer load first"
    handler = ast.unparse(_method(_class(sched, "Scheduler"), "handle_rpc_request"))
    assert "getattr(self, recv_req.method)" in handler and "RpcReqOutput(" in handler
    hooks = _class(_tree("srt/plugins/hook_registry.py"), "HookRegistry")
    assert _params(_method(hooks, "register"))[:4] == ["cls", "target", "hook", "hook_type"]
    io = _tree("srt/managers/io_struct.py")
    assert {"method", "parameters"} <= set(_fields(_class(io, "RpcReqInput")))
    assert {"success", "message"} <= set(_fields(_class(io, "RpcReqOutput")))
    engine = ast.unparse(_class(_tree("srt/entrypoints/engine.py"), "Engine"))
    assert "self.send_to_rpc = get_zmq_socket(" in engine
    assert "custom_weight_loader" in (root / "arg_groups/fields/model.py").read_text()
    updater = (root / "model_executor/model_runner_components/weight_updater.py").read_text()
    assert "elif load_format in self.custom_weight_loaders:" in updater
    assert "custom_loader(self.get_model(), named_tensors)" in updater


@needs_src
def test_stand_in_matches_the_wheel():
    """Every struct field and control-call parameter of the stand-in exists in 0.5.23."""
    contract = sys.modules["rollart_sglang_contract"]
    io = _tree("srt/managers/io_struct.py")
    for cls in (contract.PauseGenerationReqInput, contract.ContinueGenerationReqInput,
                contract.UpdateWeightsFromTensorReqInput, contract.BeginWeightUpdateReqInput,
                contract.EndWeightUpdateReqInput, contract.FlushCacheReqOutput,
                contract.RpcReqInput, contract.RpcReqOutput):
        real = set(_fields(_class(io, cls.__name__)))
        mine = {f.name for f in dataclasses.fields(cls)}
        assert mine <= real, f"{cls.__name__}: stand-in fields {mine - real} not in 0.5.23"
    tm = _class(_tree("srt/managers/tokenizer_manager.py"), "TokenizerManager")
    mixin = _class(_tree("srt/managers/tokenizer_control_mixin.py"), "TokenizerControlMixin")
    for name in ("abort_request", "pause_generation", "continue_generation",
                 "begin_weight_update", "end_weight_update", "update_weights_from_tensor",
                 "flush_cache", "get_internal_state"):
        owner = tm if name in ("abort_request", "pause_generation", "continue_generation") else mixin
        real = _params(_method(owner, name))
        mine = list(inspect.signature(getattr(contract.TokenizerManager, name)).parameters)
        assert mine == real, f"{name}: stand-in {mine} vs 0.5.23 {real}"


def test_weight_update_runs_in_a_session_after_retract(tiny_model, other_weights):
    """The adapter's update: retract, abort + resubmit, begin, one tensor update per
    bucket, end, flush (which fails while requests run), continue; the requests in flight
    (one free, one constrained: one SGLang request per token) continue with the new
    version."""
    from rollart_engine_sglang.engine import SglangEngine

    from rollart_sdk.types import GenerationRequest, SamplingParams
    from rollart_sdk.weights import split_buckets

    async def run():
        # no eos: the free request cannot stop before the update
        engine = SglangEngine(model=tiny_model, device="cpu", context_length=1024,
                              eos_token_ids=[])
        tm = engine._tm
        free = asyncio.ensure_future(engine.generate(GenerationRequest(
            "u", [5, 6, 7, 8], SamplingParams(max_new_tokens=60, seed=2))))
        constrained = asyncio.ensure_future(engine.generate(GenerationRequest(
            "c", [5, 6, 7, 8], SamplingParams(max_new_tokens=60, seed=1,
                                              allowed_token_ids=list(range(3, 60))))))
        while engine.stats()["tokens_generated"] < 6:
            await asyncio.sleep(0.002)
        buckets = list(split_buckets(other_weights.items(), bucket_bytes=20_000, version=1))
        n = await engine.load_weights(buckets, 1)
        res = await asyncio.gather(free, constrained)
        await engine.shutdown()
        return n, res, tm.calls, len(buckets)

    n, (free, constrained), calls, nb = asyncio.run(run())
    assert n == 2
    for res in (free, constrained):
        assert res.recomputed == 1 and len(res.token_ids) == 60
        assert res.versions[0] == 0 and res.versions[-1] == 1
    assert all(t in range(3, 60) for t in constrained.token_ids)
    start = calls.index("pause_generation:retract")
    tail = calls[start:]
    begin = tail.index("begin_weight_update")
    # the free request's submission is aborted (the constrained one's too when one of its
    # one-token submissions was in flight), all before the weights go in
    assert 1 <= tail[:begin].count("abort_request") <= 2 and len(tail[:begin]) == 1 + tail[:begin].count("abort_request")
    assert tail[begin + 1:begin + 1 + nb] == ["update_weights_from_tensor"] * nb
    assert tail[begin + 1 + nb:][:3] == ["end_weight_update", "flush_cache", "continue_generation"]


def test_constrained_logprobs_are_the_sampled_policy(tiny_model, reference_logits):
    """A constrained request at temperature 0.7 reports log pi(token) with
    pi = softmax(logits[allowed] / 0.7) (the distribution it was drawn from, what the
    trainer recomputes), not the full-vocabulary log-prob of the raw logits; the tokens
    stay inside the allowed set and a seed reproduces them."""
    from rollart_engine_sglang.engine import SglangEngine

    from rollart_sdk.algorithms import policy_logprob
    from rollart_sdk.types import GenerationRequest, SamplingParams

    allowed = [3, 5, 11, 17]

    async def run():
        engine = SglangEngine(model=tiny_model, device="cpu", context_length=1024)
        out = []
        for rid in ("a", "b"):
            out.append(await engine.generate(GenerationRequest(
                rid, [5, 6, 7, 8], SamplingParams(max_new_tokens=8, seed=4, temperature=0.7,
                                                  allowed_token_ids=allowed))))
        await engine.shutdown()
        return out

    a, b = asyncio.run(run())
    assert a.token_ids == b.token_ids and len(a.token_ids) == 8
    assert set(a.token_ids) <= set(allowed)
    rows = reference_logits([5, 6, 7, 8], a.token_ids)
    mask = torch.tensor(allowed)
    ref = [policy_logprob(rows[i], t, 0.7, mask) for i, t in enumerate(a.token_ids)]
    assert max(abs(x - y) for x, y in zip(a.logprobs, ref, strict=True)) < 1e-4
    # ... and far from the raw full-vocabulary ones: the allowed ids hold little mass
    raw = [float(torch.log_softmax(rows[i], -1)[t]) for i, t in enumerate(a.token_ids)]
    assert min(x - y for x, y in zip(a.logprobs, raw, strict=True)) > 1.0


def test_options_reject_impossible_combinations():
    from pydantic import ValidationError
    from rollart_engine_sglang.options import SglangEngineOptions

    with pytest.raises(ValidationError, match="float16"):
        SglangEngineOptions(device="cpu", dtype="float16")
    with pytest.raises(ValidationError, match="tp_size"):
        SglangEngineOptions(device="cpu", tp_size=2)
    with pytest.raises(ValidationError, match="torch_native"):
        SglangEngineOptions(device="cpu", attention_backend="flashinfer")
    with pytest.raises(ValidationError, match="deterministic_inference"):
        SglangEngineOptions(device="cpu", deterministic_inference=True)
    assert SglangEngineOptions(device="cuda", deterministic_inference=True).deterministic_inference
    assert SglangEngineOptions(device="cpu").enable_prefix_caching is True
