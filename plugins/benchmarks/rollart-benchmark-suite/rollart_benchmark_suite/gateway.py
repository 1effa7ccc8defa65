"""``rollart bench gateway``: what the OpenAI-compatible gateway adds per call, against
calling the LLMProxy directly, on the same engine with the same prompts.

``--episodes`` agents run at once on this event loop, each a plain ``openai`` loop of
``--calls`` chat completions (appending the reply and a user message each turn), through
the gateway on 127.0.0.1. Then the same engine is called directly through the LLMProxy,
with the same concurrency, the exact prompt ids and sampling (seeds included) the gateway
sent: the engine does the same work both ways, so the difference is the gateway (HTTP,
JSON, the ``openai`` client, the chat template render, recording, tool parsing). Engines:
``torch`` (the tiny model; what a CI run trains) or ``echo`` (answers at once with fixed
tokens: the gateway's own cost, without engine time in the way). Clients: ``http`` (a
plain JSON POST: what the gateway adds) or ``openai`` (the ``openai`` client, whose own
request building costs milliseconds a call). Each repeat measures
both; the table holds per-call latency (p50, p99), requests/s, and the added p50/p99
(gateway minus direct), medians over repeats.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from rollart_sdk.types import GenerationRequest, GenerationResult, SamplingParams


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class EchoEngine:
    """Answers every request at once with ``max_new_tokens`` copies of one token."""

    def __init__(self, token: int) -> None:
        self.token = token

    async def generate(self, request: GenerationRequest, kv: Any = None) -> GenerationResult:
        n = request.sampling.max_new_tokens
        return GenerationResult(request.request_id, [self.token] * n, [-1.0] * n, [0] * n,
                                "length")


class Bench:
    """One engine behind an LLMProxy, a Gateway, the tiny model's tokenizer."""

    def __init__(self, engine: str, episodes: int, calls: int, max_tokens: int,
                 client: str = "http") -> None:
        from rollart_sdk.config import ModelConfig, TinyModelConfig
        from rollart_sdk.control.chat import ChatFormat
        from rollart_sdk.control.handles import WorkerHandle
        from rollart_sdk.control.proxy import LLMProxy
        from rollart_sdk.gateway import Gateway
        from rollart_sdk.models import load_tokenizer, prepare_model

        tiny = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2,
                               intermediate_size=64, seed=0)
        cache = Path(tempfile.gettempdir()) / "rollart-bench-gateway-model"
        model = prepare_model(ModelConfig(tiny=tiny), cache, [])
        self.tok = load_tokenizer(str(model.path), light=True)
        self.chat = ChatFormat(self.tok)
        if engine == "torch":
            from rollart_engine_torch.engine import TorchEngine

            backend: Any = TorchEngine(model=model, max_running=episodes, max_seq_len=2048)
        else:
            backend = EchoEngine(self.tok("a", add_special_tokens=False)["input_ids"][0])
        self.proxy = LLMProxy([WorkerHandle("gen0", backend, is_ray=False)],
                              {"default": ["gen0"]})
        self.gateway = Gateway()
        self.episodes, self.calls, self.max_tokens = episodes, calls, max_tokens
        self.sent: dict[int, list[tuple[list[int], SamplingParams]]] = {}
        self.http: Any = None
        self.session: Any = None
        self.client = client
        self.clients: list[Any] = []

    def _record(self) -> Any:
        from rollart_sdk.gateway.episode import EpisodeRecord

        tok = self.tok
        return EpisodeRecord(
            lambda messages, tools: str(tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True)),
            lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
            lambda ids: str(tok.decode(ids, skip_special_tokens=False)))

    async def _proxy_call(self, ids: list[int], sampling: SamplingParams,
                          traj: str) -> GenerationResult:
        return await self.proxy.generate(GenerationRequest(
            request_id=uuid.uuid4().hex, prompt_ids=list(ids), sampling=sampling,
            trajectory_id=traj))

    def _open(self, i: int, rep: int) -> Any:
        """Episode ``i`` on the gateway and its ``openai`` client (built before the clock
        starts: a client's construction, an SSL context, blocks the loop ~0.1 s)."""
        import openai

        sent = self.sent.setdefault(i, [])

        async def generate(ids: list[int], sampling: SamplingParams) -> GenerationResult:
            sent.append((list(ids), sampling))
            return await self._proxy_call(ids, sampling, f"g{rep}-{i}")

        ep = self.gateway.open(f"r{rep}-{i}", record=self._record(), generate=generate,
                               sampling=SamplingParams(max_new_tokens=self.max_tokens,
                                                       seed=rep * 100003 + i),
                               max_turns=self.calls, max_context_tokens=2048,
                               stop_ids={self.tok.eos_token_id}, decode_text=self.chat.decode)
        return ep, openai.AsyncOpenAI(base_url=ep.base_url, api_key=ep.token, max_retries=0,
                                      http_client=self.http)

    async def _chat(self, ep: Any, client: Any, messages: list[Any]) -> str:
        if self.client == "openai":
            reply = await client.chat.completions.create(model="policy", messages=messages)
            return str(reply.choices[0].message.content)
        async with self.session.post(f"{ep.base_url}/chat/completions",
                                     json={"model": "policy", "messages": messages},
                                     headers={"authorization": f"Bearer {ep.token}"}) as r:
            body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"the gateway answered {r.status}: {body}")
        return str(body["choices"][0]["message"]["content"])

    async def _agent(self, i: int, rep: int, lat: list[float]) -> None:
        ep, client = self.clients[i]
        messages: list[Any] = [{"role": "user", "content": f"Question {i}?"}]
        for k in range(self.calls):
            t0 = time.perf_counter()
            content = await self._chat(ep, client, messages)
            lat.append(time.perf_counter() - t0)
            messages += [{"role": "assistant", "content": content},
                         {"role": "user", "content": f"And {k}?"}]
        self.gateway.close(ep.episode_id)

    async def _direct(self, i: int, rep: int, lat: list[float]) -> None:
        for ids, sampling in self.sent[i]:
            t0 = time.perf_counter()
            await self._proxy_call(ids, sampling, f"d{rep}-{i}")
            lat.append(time.perf_counter() - t0)

    async def repeat(self, rep: int) -> dict[str, Any]:
        import openai

        self.sent.clear()
        if self.http is None:  # one connection pool, as agents in one process share
            import aiohttp

            self.http = openai.DefaultAsyncHttpxClient()
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.episodes + 8))
        self.clients = [self._open(i, rep) for i in range(self.episodes)]
        out: dict[str, Any] = {}
        for side, fn in (("gateway", self._agent), ("direct", self._direct)):
            lat: list[float] = []
            t0 = time.perf_counter()
            await asyncio.gather(*(fn(i, rep, lat) for i in range(self.episodes)))
            wall = time.perf_counter() - t0
            out[side] = {"p50_ms": _pct(lat, 0.5) * 1e3, "p99_ms": _pct(lat, 0.99) * 1e3,
                         "rps": len(lat) / wall, "calls": len(lat)}
        out["added_p50_ms"] = out["gateway"]["p50_ms"] - out["direct"]["p50_ms"]
        out["added_p99_ms"] = out["gateway"]["p99_ms"] - out["direct"]["p99_ms"]
        return out


async def _run(engine: str, episodes: int, calls: int, max_tokens: int, repeats: int,
               client: str = "http") -> dict[str, Any]:
    bench = Bench(engine, episodes, calls, max_tokens, client)
    await bench.gateway.start()
    try:
        await bench.repeat(-1)  # warm-up: imports, the engine's first batches, connections
        reps = [await bench.repeat(r) for r in range(repeats)]
    finally:
        if bench.http is not None:
            await bench.http.aclose()
            await bench.session.close()
        await bench.gateway.stop()

    def med(*path: str) -> float:
        vals = []
        for r in reps:
            v: Any = r
            for p in path:
                v = v[p]
            vals.append(float(v))
        return statistics.median(vals)

    return {
        "benchmark": "gateway", "engine": engine, "client": client, "episodes": episodes,
        "calls": calls,
        "max_tokens": max_tokens, "repeats": reps,
        "median": {side: {k: med(side, k) for k in ("p50_ms", "p99_ms", "rps")}
                   for side in ("gateway", "direct")}
        | {"added_p50_ms": med("added_p50_ms"), "added_p99_ms": med("added_p99_ms")},
    }


def run(engine: str = "torch", episodes: int = 128, calls: int = 4, max_tokens: int = 8,
        repeats: int = 3, client: str = "http") -> dict[str, Any]:
    return asyncio.run(_run(engine, episodes, calls, max_tokens, repeats, client))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rollart bench gateway",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("torch", "echo"), default="torch",
                        help="torch: the tiny model; echo: instant answers (gateway cost only)")
    parser.add_argument("--client", choices=("http", "openai"), default="http",
                        help="http: a plain aiohttp JSON POST (the gateway's cost); openai: "
                             "the openai client (adds its own request building)")
    parser.add_argument("--episodes", type=int, default=128, help="agents at once")
    parser.add_argument("--calls", type=int, default=4, help="chat completions per agent")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (median)")
    parser.add_argument("--json", metavar="PATH", default=None, help="also write results here")
    args = parser.parse_args(argv)
    if min(args.episodes, args.calls, args.max_tokens, args.repeats) < 1:
        parser.error("--episodes, --calls, --max-tokens and --repeats must be >= 1")
    res = run(args.engine, args.episodes, args.calls, args.max_tokens, args.repeats,
              args.client)

    from rich.console import Console
    from rich.table import Table

    m = res["median"]
    table = Table(title=f"gateway vs direct LLMProxy calls ({args.engine} engine, "
                        f"{args.client} client, "
                        f"{args.episodes} agents x {args.calls} calls, median of "
                        f"{args.repeats})")
    for col in ("side", "p50 ms", "p99 ms", "requests/s"):
        table.add_column(col, justify="right" if col != "side" else "left")
    for side in ("direct", "gateway"):
        table.add_row(side, f"{m[side]['p50_ms']:.2f}", f"{m[side]['p99_ms']:.2f}",
                      f"{m[side]['rps']:.1f}")
    table.add_row("added", f"{m['added_p50_ms']:.2f}", f"{m['added_p99_ms']:.2f}", "")
    console = Console()
    console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
        console.print(f"wrote {args.json}")
    return 0
