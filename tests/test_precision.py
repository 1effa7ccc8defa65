"""Mixed precision: the trainer options (``rollart_sdk.backends.precision``), the
master-weights optimizer wrapper (``rollart_sdk.backends.master_weights``) and the warning
``validate`` gives for a low-precision run without master weights. The trainers' own tests train with them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from rollart_sdk.backends.master_weights import LossScaler, MasterWeightsOptimizer
from rollart_sdk.backends.precision import PrecisionOptions
from rollart_sdk.config import RunConfig
from rollart_sdk.job.preflight import check_precision
from rollart_sdk.testing.dists import run_cli


def test_options_decide_masters_and_scaling_per_dtype() -> None:
    auto = PrecisionOptions()
    assert [auto.uses_master_weights(d) for d in ("float32", "bfloat16", "float16")] == [
        False, True, True]
    assert auto.loss_scaling("float16") == (True, 2.0**16)
    assert auto.loss_scaling("bfloat16") == auto.loss_scaling("float32") == (False, 1.0)
    # YAML's true/false, and the on/off spelling other options use
    for value, want in ((True, True), ("false", False), ("on", True), ("off", False)):
        assert PrecisionOptions(master_weights=value).uses_master_weights("float32") is want
    assert PrecisionOptions(loss_scale="dynamic").loss_scaling("bfloat16") == (True, 2.0**16)
    assert PrecisionOptions(loss_scale=512).loss_scaling("float16") == (False, 512.0)
    for bad in ({"loss_scale": 0}, {"loss_scale": "static"}, {"master_weights": "maybe"},
                {"loss_scale_growth_interval": 0}):
        with pytest.raises(ValidationError):
            PrecisionOptions(**bad)


def test_warnings_name_the_dtype_the_key_and_the_fix() -> None:
    assert PrecisionOptions().precision_warnings("bfloat16") == []
    assert PrecisionOptions().precision_warnings("float16") == []
    assert PrecisionOptions(master_weights=False).precision_warnings("float32") == []
    (w,) = PrecisionOptions(master_weights=False).precision_warnings("bfloat16")
    assert "model.dtype is bfloat16" in w and "trainer.options.master_weights is false" in w
    assert "round away" in w and "set trainer.options.master_weights to auto or true" in w
    ws = PrecisionOptions(master_weights=False, loss_scale=1).precision_warnings("float16")
    assert len(ws) == 2 and "loss_scale is 1" in ws[1] and "auto or dynamic" in ws[1]


def test_check_precision_asks_the_trainers_options_or_says_it_cannot_tell() -> None:
    cfg = RunConfig.model_validate({"model": {"tiny": {}, "dtype": "bfloat16"},
                                    "tasks": [{"tag": "t", "env": {"name": "frozenlake"}}]})
    desc = SimpleNamespace(name="custom")
    ours = SimpleNamespace(options=PrecisionOptions(master_weights=False), descriptor=desc)
    assert len(check_precision(cfg, ours)) == 1
    ours.options = PrecisionOptions()
    assert check_precision(cfg, ours) == []
    (w,) = check_precision(cfg, SimpleNamespace(options=SimpleNamespace(), descriptor=desc))
    assert "trainer 'custom' has no master_weights option" in w
    cfg.model.dtype = "float32"
    assert check_precision(cfg, SimpleNamespace(options=None, descriptor=desc)) == []


def test_validate_warns_on_bf16_without_master_weights(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"""\
model:
  tiny: {{hidden_size: 32, num_heads: 2}}
  dtype: bfloat16
tasks:
  - tag: FrozenLake
    env: {{name: frozenlake}}
    max_turns: 2
rollout: {{batch_size: 4, group_size: 2}}
trainer: {{name: torch}}
output_dir: {tmp_path / "runs"}
""")
    quiet = run_cli("validate", str(cfg))
    assert quiet.returncode == 0 and "master_weights" not in quiet.stdout, quiet.stdout
    res = run_cli("validate", str(cfg), "trainer.options.master_weights=false")
    out = " ".join(res.stdout.split())  # rich wraps long lines
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning: model.dtype is bfloat16 and trainer.options.master_weights is false" in out


def _model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 2)).to(dtype)


def _adamw(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def _steps(model: torch.nn.Module, opt: MasterWeightsOptimizer, n: int, start: int = 0) -> None:
    g = torch.Generator().manual_seed(3)
    for i in range(start + n):
        x = torch.randn(16, 8, generator=g)
        if i < start:
            continue
        opt.zero_grad()
        loss = model(x.to(next(model.parameters()).dtype)).float().square().mean()
        opt.scale_loss(loss).backward()
        grads = opt.main_grads()
        finite = all(bool(torch.isfinite(gr).all()) for gr in grads)
        opt.update_scale(finite)
        if finite:
            opt.step()


def test_masters_keep_updates_bf16_rounds_away_with_torch_adamw() -> None:
    """The wrapper around ``torch.optim.AdamW`` (the trainers' GPU optimizer): at lr 1e-6
    the fp32 masters move on every element, the bf16 weights of the same model almost
    nowhere; without masters AdamW's update of the bf16 weights rounds away as well."""
    model = _model(torch.bfloat16)
    opt = MasterWeightsOptimizer(model.parameters(), _adamw, master_weights=True)
    start = [m.clone() for m in opt.main_params]
    _steps(model, opt, 5)
    moved = torch.cat([(m != s).reshape(-1) for m, s in zip(opt.main_params, start, strict=True)])
    assert float(moved.float().mean()) > 0.95
    for p, m in zip(opt.params, opt.main_params, strict=True):
        assert torch.equal(p.detach(), m.to(torch.bfloat16))
    plain_model = _model(torch.bfloat16)
    before = [p.detach().clone() for p in plain_model.parameters()]
    plain = MasterWeightsOptimizer(plain_model.parameters(), _adamw, master_weights=False)
    _steps(plain_model, plain, 5)
    same = torch.cat([(p.detach() == b).reshape(-1)
                      for p, b in zip(plain_model.parameters(), before, strict=True)])
    assert float(same.float().mean()) > 0.9


def test_stochastic_rounding_moves_the_bf16_weights_with_their_masters_on_average() -> None:
    """A bf16 layer (65k weights, starting on bf16 values), 5 AdamW steps at lr 1e-5:
    rounded to nearest, the weights show a fifth of the masters' change (a weight moves
    once its updates add up to about |w| * 2**-9); rounded stochastically, all of it (the
    per-element error of one bf16 step cancels over the elements). The draws are the seed's and the step's:
    two runs round alike, and a state dict resumed after 3 steps rounds steps 4-5 as a
    straight run does."""
    def make(rounding: str, seed: int = 0) -> tuple[torch.nn.Module, MasterWeightsOptimizer]:
        torch.manual_seed(0)
        model = torch.nn.Linear(256, 256, bias=False).to(torch.bfloat16)
        opt = MasterWeightsOptimizer(
            model.parameters(), lambda ps: torch.optim.AdamW(ps, lr=1e-5, weight_decay=0.0),
            master_weights=True, rounding=rounding, seed=seed)
        return model, opt

    def steps(model: torch.nn.Module, opt: MasterWeightsOptimizer, first: int, last: int) -> None:
        for i in range(first, last):
            x = torch.randn(32, 256, generator=torch.Generator().manual_seed(i))
            opt.zero_grad()
            model(x.to(torch.bfloat16)).float().square().mean().backward()
            opt.main_grads()
            opt.step()

    def run(rounding: str, seed: int = 0) -> MasterWeightsOptimizer:
        model, opt = make(rounding, seed)
        steps(model, opt, 0, 5)
        return opt

    start = make("nearest")[0].weight.detach().float().reshape(-1)

    def carried(opt: MasterWeightsOptimizer) -> float:
        """The share of the masters' change (along its signs) the bf16 weights show."""
        masters = opt.main_params[0].detach().reshape(-1) - start
        weights = opt.params[0].detach().float().reshape(-1) - start
        return float((weights * masters.sign()).sum() / masters.abs().sum())

    assert carried(run("nearest")) < 0.5  # 0.21 here: the larger weights have not moved
    sr = run("stochastic")
    assert abs(carried(sr) - 1.0) < 0.1  # 0.996 here
    assert torch.equal(run("stochastic").params[0], sr.params[0])
    assert not torch.equal(run("stochastic", seed=1).params[0], sr.params[0])
    model, first = make("stochastic")
    steps(model, first, 0, 3)
    model2, resumed = make("stochastic")
    model2.load_state_dict(model.state_dict())
    resumed.load_state_dict(first.state_dict())
    steps(model2, resumed, 3, 5)
    assert torch.equal(resumed.params[0], sr.params[0])
    with pytest.raises(ValueError, match="nearest or stochastic"):
        MasterWeightsOptimizer([start], _adamw, master_weights=True, rounding="up")


def test_state_dict_round_trip_resumes_bit_for_bit() -> None:
    """3 steps, state dict (masters, fp32 moments, loss scale) into a fresh model and
    optimizer whose weights were loaded, 2 more: the same as 5 straight steps."""
    def make() -> tuple[torch.nn.Module, MasterWeightsOptimizer]:
        model = _model(torch.float16)
        return model, MasterWeightsOptimizer(model.parameters(), _adamw, master_weights=True,
                                             scaler=LossScaler(2.0**8, True, 2))
    straight_model, straight = make()
    _steps(straight_model, straight, 5)
    model, opt = make()
    _steps(model, opt, 3)
    sd = opt.state_dict()
    assert set(sd["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "master"}
    assert sd["state"][0]["master"].dtype == torch.float32
    assert sd["param_groups"][0]["loss_scale"] == opt.loss_scale
    assert "master" not in opt.state[opt.main_params[0]]  # the live state is untouched
    model2, opt2 = make()
    model2.load_state_dict(model.state_dict())
    opt2.load_state_dict(sd)
    assert opt2.loss_scale == opt.loss_scale and opt2.scaler.good_steps == opt.scaler.good_steps  # type: ignore[union-attr]
    _steps(model2, opt2, 2, start=3)
    for a, b in zip(opt2.main_params, straight.main_params, strict=True):
        assert torch.equal(a, b)
    assert opt2.loss_scale == straight.loss_scale
    with pytest.raises(ValueError, match="different architecture"):
        other = MasterWeightsOptimizer(torch.nn.Linear(8, 3).parameters(), _adamw,
                                       master_weights=True)
        bad = {**sd, "state": {0: {"master": torch.zeros(5, 5)}},
               "param_groups": [{**sd["param_groups"][0], "params": [0, 1]}]}
        other.load_state_dict(bad)


def test_loss_scaler_backs_off_grows_and_floors() -> None:
    s = LossScaler(8.0, dynamic=True, growth_interval=2)
    s.update(True)
    assert s.scale == 8.0
    s.update(True)
    assert s.scale == 16.0 and s.good_steps == 0
    s.update(True)
    s.update(False)  # an overflow resets the count
    assert s.scale == 8.0 and s.good_steps == 0
    for _ in range(10):
        s.update(False)
    assert s.scale == 1.0  # Megatron's min_loss_scale
