"""Prefill-decode disaggregation on the torch engine, through the real wiring: config
(roles.actor_gen.prefill/decode) -> resource plan -> workers -> LLMProxy -> engines."""

from __future__ import annotations

import asyncio

import pytest

from rollart_sdk.config import load_config
from rollart_sdk.errors import ConfigError
from rollart_sdk.job import build_job
from rollart_sdk.types import GenerationRequest, SamplingParams


def _config(tmp_path, pd: bool) -> dict:
    data = {
        "name": "pd",
        "model": {"tiny": {"hidden_size": 32, "num_layers": 2, "num_heads": 2,
                           "intermediate_size": 64}},
        "tasks": [{"tag": "FrozenLake", "env": {"name": "frozenlake"},
                   "system_prompt": None, "max_turns": 3}],
        "engine": {"name": "torch", "options": {"eos_token_ids": []}},
        "transport": {"name": "local"},
        "rollout": {"batch_size": 4, "group_size": 2, "mode": "sync"},
        "output_dir": str(tmp_path),
    }
    if pd:
        data["roles"] = {"actor_gen": {"prefill": {"workers": 1}, "decode": {"workers": 2}}}
    return data


async def _dialogues(proxy, n: int, tags: tuple[str, ...] = ("FrozenLake",)) -> list[list[int]]:
    """n multi-turn trajectories at once (trajectory i has tag ``tags[i % len(tags)]``);
    each turn's prompt is the whole context: 6 tokens, then + 4 sampled + 2 observed."""

    async def one(i: int) -> list[int]:
        ctx = [10 + i, 11, 12, 13, 14, 15]
        out = []
        for t in range(3):
            req = GenerationRequest(f"tr{i}/t{t}", list(ctx),
                                    SamplingParams(seed=100 * i + t, max_new_tokens=4),
                                    tag=tags[i % len(tags)], trajectory_id=f"tr{i}")
            res = await proxy.generate(req)
            assert res.finish_reason == "length"
            out += res.token_ids
            ctx += res.token_ids + [20, 21 + t]
        proxy.release(f"tr{i}")
        return out

    out = list(await asyncio.gather(*(one(i) for i in range(n))))
    for _ in range(10):  # let the background releases reach the engines
        await asyncio.sleep(0)
    return out


def _run(tmp_path, pd: bool, data: dict | None = None, tags: tuple[str, ...] = ("FrozenLake",)):
    cfg, lines = load_config(data=data or _config(tmp_path, pd))
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        proxy = job.pipeline.proxy
        tokens = asyncio.run(_dialogues(proxy, 4, tags))
        stats = {name: w.target.engine.stats() for name, w in
                 {**proxy.workers, **proxy.prefill_workers}.items()}
        return tokens, stats, proxy
    finally:
        job.run_dir.close()
        job.close()


def test_pd_tokens_equal_the_single_engine_run(tmp_path):
    plain, plain_stats, _ = _run(tmp_path / "plain", pd=False)
    pd, pd_stats, proxy = _run(tmp_path / "pd", pd=True)
    assert pd == plain
    prefill = [s for name, s in pd_stats.items() if name in proxy.prefill_workers]
    decode = [s for name, s in pd_stats.items() if name in proxy.workers]
    assert len(prefill) == 1 and len(decode) == 2
    # The prefill worker computed every prompt and sampled nothing; the decode workers
    # sampled every token and imported the prompts' K/V instead of computing them.
    assert prefill[0]["tokens_generated"] == 0 and prefill[0]["prefill_tokens"] > 0
    assert sum(s["tokens_generated"] for s in decode) == 4 * 3 * 4
    assert all(s["reused_tokens"] > 0 for s in decode)
    # Both sides kept each trajectory's cache between its turns (prompts of 6, 12 and 18
    # tokens: + 4 answered, + 2 observed): the prefill worker computed the first prompt
    # (5), then only each observation (2): the decode worker handed each answer's K/V
    # back; only the K/V the decode worker lacked travelled to it (5, then 2 and 2); the
    # decode workers computed nothing but each prompt's last token.
    assert prefill[0]["prefill_tokens"] == 4 * (5 + 2 + 2) and prefill[0]["kv_evicted"] == 0
    assert prefill[0]["handoff_tokens_out"] == 4 * (5 + 2 + 2)
    assert sum(s["prefill_tokens"] for s in decode) == 0
    assert sum(s["reused_tokens"] for s in decode) == 4 * (5 + 11 + 17)
    assert sum(s["handoff_short"] for s in decode) == 0
    # The trajectories ended: the proxy released what both sides kept for them.
    assert prefill[0]["kv_idle"] == 0 and all(s["kv_idle"] == 0 for s in decode)


def test_pd_prefill_follows_task_affinity(tmp_path):
    """Per-task affinity under PD: each task's prompts are computed by the prefill worker
    of the pool its affinity names; every task decodes on the decode workers."""
    data = _config(tmp_path, pd=True)
    data["pools"] = [
        {"name": "H800", "hardware": "H800", "profile": "compute", "count": 4},
        {"name": "H20", "hardware": "H20", "profile": "bandwidth", "count": 4},
        {"name": "cpu", "hardware": "cpu", "kind": "cpu", "count": 8},
    ]
    lake = data["tasks"][0]
    data["tasks"] = [{**lake, "tag": "A", "affinity": "H800"},
                     {**lake, "tag": "B", "affinity": "H20"}]
    data["roles"]["actor_gen"] = {"prefill": {"workers": 2}, "decode": {"pool": "H20",
                                                                        "workers": 1}}
    plain, _, _ = _run(tmp_path / "plain", pd=False)
    tokens, stats, proxy = _run(tmp_path, pd=True, data=data, tags=("A", "B"))
    assert tokens == plain
    pools = {name: w.pool for name, w in proxy.prefill_workers.items()}
    assert sorted(pools.values()) == ["H20", "H800"]
    for tag, pool in (("A", "H800"), ("B", "H20")):
        (name,) = proxy.prefill_routes[tag]
        assert pools[name] == pool
        # its task's two trajectories only: 5 + 2 + 2 prompt tokens each (see above)
        assert stats[name]["prefill_tokens"] == 2 * 9
    assert set(proxy.routes["A"]) == set(proxy.routes["B"]) == set(proxy.workers)


def test_pd_needs_both_phases(tmp_path):
    data = _config(tmp_path, pd=False)
    data["roles"] = {"actor_gen": {"prefill": {"workers": 1}}}
    with pytest.raises(ConfigError, match="both"):
        load_config(data=data)


def test_validate_rejects_pd_on_an_engine_without_kv_handoff(tmp_path):
    """`rollart validate` (not only the job build) names the key when the engine cannot
    hand K/V over: vLLM's adapter has no prefill_kv (importable without vLLM itself)."""
    import yaml

    from rollart_sdk.testing.dists import run_cli

    data = _config(tmp_path, pd=True)
    data["engine"] = {"name": "vllm"}
    data["transport"] = {"name": "ray"}  # vLLM runs in a process of its own
    cfg = tmp_path / "pd-vllm.yaml"
    cfg.write_text(yaml.safe_dump(data))
    res = run_cli("validate", str(cfg))
    assert res.returncode != 0
    assert "roles.actor_gen.prefill" in res.stderr and "no prefill_kv" in res.stderr


@pytest.mark.timeout(900)  # a local Ray and a 2-step run: minutes on a loaded machine
def test_pd_trains_on_ray(tmp_path):
    """`rollart train` with roles.actor_gen.prefill/decode on a local Ray: the K/V hand-off
    goes prefill actor -> object store -> decode actor, and every engine gets the weights."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    data = _config(tmp_path, pd=True)
    data["roles"]["actor_gen"]["decode"]["workers"] = 1
    data["train"] = {"steps": 2, "bucket_mb": 1, "save_final_model": False}
    data["transport"] = {"name": "ray"}
    data["layout"] = "ray"  # one process per engine (auto would run it in process)
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    res = subprocess.run([sys.executable, "-m", "rollart_sdk.cli", "train", str(cfg),
                          "--no-progress", f"output_dir={tmp_path / 'runs'}"],
                         capture_output=True, text=True, env=env, timeout=850)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("pd")]
    summary = json.loads((run / "summary.json").read_text())
    bindings = {b["worker"]: b for b in json.loads((run / "bindings.json").read_text())}
    assert "gen-prefill-0" in bindings and "gen-0" in bindings
    # Only the decode worker answers requests; the prefill worker only computes prompts.
    assert set(summary["served"]) == {"FrozenLake@gen-0"}
    assert summary["trained"] > 0 and summary["dropped"] == {}
    # Both engines loaded every update (the prefill worker's K/V must match the weights).
    from collections import Counter

    per_version = Counter(u["version"] for u in summary["weight_updates"])
    assert per_version and set(per_version.values()) == {2}, per_version
    # The decode worker imported the prompts' K/V from the object store: it sampled every
    # token and computed fewer prompt tokens than the prefill worker did.
    engines = summary["engines"]
    assert engines["gen-prefill-0"]["tokens_generated"] == 0
    assert engines["gen-0"]["tokens_generated"] > 0 and "pd_handoff_errors" not in engines["gen-0"]
    # Each answer's K/V went back to the prefill worker through the object store (a ref
    # put by the decode actor), and it used them: no failed fetch there either.
    assert "pd_handoff_errors" not in engines["gen-prefill-0"]
    assert engines["gen-0"]["prefill_tokens"] < engines["gen-prefill-0"]["prefill_tokens"]
    plan = json.loads((run / "plan.json").read_text())
    assert plan["roles"]["actor_gen"]["prefill_per_pool"] and plan["threads"]["actor_gen"] >= 1


class ActorDiedError(RuntimeError):
    """Stands in for ``ray.exceptions.ActorDiedError`` (the proxy reads errors by name)."""


@pytest.mark.parametrize("error", [ActorDiedError, ValueError])
def test_dead_prefill_worker_leaves_the_routes_at_its_first_failed_handoff(tmp_path, error):
    """The prefill worker's process dies: the decode workers compute the prompts themselves
    (same tokens), and the proxy takes the prefill worker out at the first failed hand-off
    instead of sending every later prompt to it. Any other hand-off error (a bug, a
    transient fault) is counted but leaves it in the routes."""
    plain, _, _ = _run(tmp_path / "plain", pd=False)
    cfg, lines = load_config(data=_config(tmp_path / "pd", pd=True))
    job = build_job(cfg, lines, in_process=True, log=lambda *a: None)
    try:
        proxy = job.pipeline.proxy
        (pre_name, pre), = proxy.prefill_workers.items()

        async def dead(*a, **kw):
            raise error("prefill worker gone")

        pre.target.prefill_kv = dead
        pre.target.restart_state = dead  # not back (recovery keeps waiting meanwhile)
        tokens = asyncio.run(_dialogues(proxy, 4))
        failed = sum(sum(w.target.handoff_errors.values()) for w in proxy.workers.values())
    finally:
        job.run_dir.close()
        job.close()
    assert tokens == plain  # the decoders computed every prompt themselves
    if error is ActorDiedError:
        assert pre_name in proxy.down and "prefill hand-off: ActorDiedError" in proxy.down[pre_name]
        assert 1 <= failed <= 4  # the 4 first turns in flight at once; none after
    else:
        assert pre_name not in proxy.down
        assert failed == 4 * 3  # every turn tried it and fell back
