"""`rollart train examples/agent_calc_sdk.yaml`: an agent written with the OpenAI Agents SDK
(the library from PyPI, unmodified; env ``calc_agent`` of plugins/envs/rollart-env-calc-agent)
trains on a calculator tool-use task with the tiny model.

The run is the CLI's own (``rollart_sdk.cli.main``; its layout is ``inprocess``, so the
engine, trainer and agents share this process) with three read-only taps: what the torch
engine generated (``TorchEngine.generate``), what the trainer trained
(``TorchTrainer.train_step``), and what the SDK sent over HTTP (``httpx2.AsyncClient.send``,
the ``openai`` client's transport). Then every trained sample's completion tokens are the
engine's tokens (with its log-probs) on the engine's prompt, every such prompt is the chat
template's render of the messages and tools the SDK sent in that episode, and the run's
accounting balances.

openai-agents is a dev dependency (``bash scripts/install.sh --dev``): the test fails, not
skips, without it.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "examples/agent_calc_sdk.yaml"
pytestmark = pytest.mark.timeout(600)


class Taps:
    """What the engine generated, the trainer trained and the agents sent."""

    def __init__(self) -> None:
        self.generated: list[tuple[str, list[int], list[int], list[float]]] = []
        self.trained: list[Any] = []
        self.requests: dict[str, list[dict[str, Any]]] = {}  # episode -> chat request bodies

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import httpx2
        from rollart_engine_torch.engine import TorchEngine
        from rollart_trainer_torch.trainer import TorchTrainer

        generate, train_step, send = (TorchEngine.generate, TorchTrainer.train_step,
                                      httpx2.AsyncClient.send)
        taps = self

        async def tapped_generate(engine: Any, request: Any, *args: Any, **kw: Any) -> Any:
            result = await generate(engine, request, *args, **kw)
            taps.generated.append((request.trajectory_id or "", list(request.prompt_ids),
                                   list(result.token_ids), list(result.logprobs)))
            return result

        def tapped_train_step(trainer: Any, batch: list[Any]) -> Any:
            taps.trained += [json.loads(json.dumps(vars(s))) for s in batch]  # a deep copy
            return train_step(trainer, batch)

        async def tapped_send(client: Any, request: Any, *args: Any, **kw: Any) -> Any:
            path = request.url.path
            if request.method == "POST" and path.endswith("/chat/completions"):
                episode = path.split("/e/", 1)[1].split("/v1/", 1)[0]
                taps.requests.setdefault(episode, []).append(json.loads(request.content))
            return await send(client, request, *args, **kw)

        monkeypatch.setattr(TorchEngine, "generate", tapped_generate)
        monkeypatch.setattr(TorchTrainer, "train_step", tapped_train_step)
        monkeypatch.setattr(httpx2.AsyncClient, "send", tapped_send)


def _spans(mask: list[int]) -> list[tuple[int, int]]:
    """The runs of trained (mask 1) tokens, as [start, end)."""
    spans, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    return spans


def _for_template(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The OpenAI messages as chat templates take them (transformers' convention): tool
    call arguments as objects, text parts joined."""
    out = []
    for m in messages:
        m = dict(m)
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in m["tool_calls"]]
        out.append(m)
    return out


def _parting(a: list[int], b: list[int]) -> int:
    """The first position where ``a`` and ``b`` differ (the shorter length if neither)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def _diff(tok: Any, got: list[int], renders: list[list[int]]) -> str:
    """Where the prompt and the nearest render part, as text."""
    best = max(renders, key=lambda r: _parting(got, r))
    at = _parting(got, best)
    return (f"the prompt differs from the render at token {at}: prompt "
            f"{tok.decode(got[at - 20:at + 40])!r}, render {tok.decode(best[at - 20:at + 40])!r}")


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Taps, Path]:
    from rollart_sdk.cli import main

    taps = Taps()
    taps.install(monkeypatch)
    monkeypatch.chdir(ROOT)  # the config's chat_template path is the repository's
    with mock.patch.dict(os.environ):  # `rollart train` sets its defaults (Ray, threads)
        rc = main(["train", CONFIG, "--no-progress", f"output_dir={tmp_path}"])
    import gc

    gc.unfreeze()  # `rollart train` freezes the heap for its exit; this process goes on
    assert rc == 0
    (run,) = [d for d in tmp_path.iterdir() if d.name.startswith("agent_calc_sdk")]
    return taps, run


def test_agents_sdk_agent_trains_on_the_engines_tokens(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    assert importlib.util.find_spec("agents") is not None, (
        "openai-agents is not installed; bash scripts/install.sh --dev installs it (or pip "
        "install -c constraints.txt 'openai-agents==0.24.0')")
    taps, run = _train(tmp_path, monkeypatch)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["layout"]["layout"] == "inprocess"  # what `rollart train` chose
    assert summary["launched"] == summary["trajectories_trained"] + sum(
        summary["dropped"].values())
    lasts = [x for x in taps.trained if x["segment"] == 0]  # one per trajectory
    assert len(lasts) == summary["trajectories_trained"] == 2 * 8

    from transformers import AutoTokenizer

    (model,) = (tmp_path / ".models").iterdir()
    tok = AutoTokenizer.from_pretrained(model)
    template = (ROOT / "examples/templates/tiny_tools.jinja").read_text()

    def render(body: dict[str, Any]) -> list[int]:
        text = tok.apply_chat_template(_for_template(body["messages"]), tools=body["tools"],
                                       chat_template=template, add_generation_prompt=True,
                                       tokenize=False)
        return list(tok(text, add_special_tokens=False)["input_ids"])

    engine = {(tuple(p), tuple(t)): (traj, lps) for traj, p, t, lps in taps.generated}
    last_call = {traj: (tuple(p), tuple(t)) for traj, p, t, _ in taps.generated}
    trained_calls = []
    for sample in taps.trained:
        ids, spans = sample["input_ids"], _spans(sample["loss_mask"])
        assert spans, "a trained sample without a generated token"
        for start, end in spans:
            key = (tuple(ids[:start]), tuple(ids[start:end]))
            # The completion is what the engine generated, on exactly this prompt.
            assert key in engine, "a trained completion the engine did not generate there"
            traj, logprobs = engine[key]
            assert sample["behaviour_logprobs"][start:end] == logprobs
            # The prompt is the template's render of one of this episode's requests.
            bodies = taps.requests[traj]
            assert all(b["tools"][0]["function"]["name"] == "calculator" for b in bodies)
            assert ids[:start] in [render(b) for b in bodies], _diff(tok, ids[:start],
                                                                    [render(b) for b in bodies])
            trained_calls.append((traj, key))
        # The last segment ends with the episode's last model call (the final answer's
        # turn); an earlier one (the agent's history was rendered otherwise) with another.
        assert (key == last_call[traj]) == (sample["segment"] == 0)
    # Every model call of a trained episode is trained, once (every segment is a sample):
    # the random model's replies often render otherwise (special tokens it sampled, an
    # empty reply the SDK drops), so some episodes have two segments.
    assert any(x["segment"] > 0 for x in taps.trained)
    trained_trajs = {t for t, _ in trained_calls}
    assert sorted(trained_calls) == sorted(
        (traj, (tuple(p), tuple(t))) for traj, p, t, _ in taps.generated if traj in trained_trajs)
    assert '"name": "calculator"' in tok.decode(taps.trained[0]["input_ids"])
    # Every prompt the engine got in an agent episode is the render of one of its requests.
    renders = {traj: [render(b) for b in bodies] for traj, bodies in taps.requests.items()}
    assert all(p in renders[traj] for traj, p, _, _ in taps.generated)
    # The agent asked again when the answer was not a number: multi-request episodes, and
    # (the follow-up extending the conversation) samples that hold two of the model's turns.
    assert max(len(b) for b in taps.requests.values()) >= 2
    assert any(len(_spans(s["loss_mask"])) >= 2 for s in taps.trained)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["agent/requests/calc"] >= 1 for m in metrics)
