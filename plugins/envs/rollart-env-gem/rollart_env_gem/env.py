"""One GEM environment behind the gymnasium text-env interface rollart uses.

GEM envs (``gem.make(id)``) already speak text: ``reset(seed) -> (obs, info)``,
``step(text) -> (obs, reward, terminated, truncated, info)``. This adapter adds what a
shared env worker needs:

- **isolated randomness**: GEM draws from the *global* ``random`` / ``numpy.random``
  state (its ``reset(seed)`` calls ``random.seed``). Each adapter keeps its own copy of
  that state and swaps it in, under one process-wide lock, around every GEM call, so
  concurrent envs in one worker neither race nor disturb each other, and one reset seed
  fixes the whole episode;
- GEM's per-turn ``info["suffix"]`` ("Enter your next guess.") appended to the
  observation, and the ``\\boxed{}`` instruction for single-turn reasoning / math tasks;
- GEM's terminal-state marker replaced by plain text; a step cap so every episode ends;
  ``info["success"]`` (the episode ended with reward >= 1).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rollart_env_gem.factory import LOCAL_MATH

MATH_DATA = Path(__file__).with_name("data") / "math_mini.jsonl"
BOXED_HINT = "Put your final answer within \\boxed{}."
_TERMINAL = "<｜TERMINAL_STATE｜>"
_GLOBAL_RNG = threading.RLock()  # guards the interpreter-wide random / numpy.random state


class GemOptions(BaseModel):
    """Options of every ``gem/<id>`` env (``tasks[].env.options`` in a run config)."""

    model_config = ConfigDict(extra="forbid")

    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of the keyword arguments GEM registered for this id "
        "(e.g. {max_turns: 10}); only keys GEM registered are accepted",
    )
    dataset_path: str | None = Field(
        None, description="gem/math:local only: a JSONL file of {problem, answer} (default: shipped)"
    )
    append_suffix: bool = Field(True, description="append GEM's per-turn instruction to observations")
    max_steps: int = Field(200, ge=1, description="truncate an episode after this many steps")
    seed: int = Field(0, ge=0, description="seeds the random state GEM builds the env with")


def _quiet_import_gem() -> Any:
    """Import gem without letting its logging.basicConfig(INFO) reconfigure the process."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import gem

    root.handlers[:], root.level = handlers, level
    return gem


def _load_math(path: str | None) -> Any:
    from datasets import Dataset

    source = Path(path) if path else MATH_DATA
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    bad = [i for i, r in enumerate(rows) if not {"problem", "answer"} <= set(r)]
    if not rows or bad:
        raise ValueError(f"{source}: every line needs 'problem' and 'answer' (bad lines: {bad[:5]})")
    return Dataset.from_list([{"problem": r["problem"], "answer": str(r["answer"])} for r in rows])


class GemTextEnv(gymnasium.Env):
    """``gem.make(gem_id)`` with text in / text out and per-instance random state."""

    metadata = {"render_modes": []}

    def __init__(self, gem_id: str, **options: Any) -> None:
        self.options = o = GemOptions(**options)
        self.gem_id = gem_id
        if o.dataset_path is not None and gem_id != LOCAL_MATH:
            raise ValueError(f"dataset_path is only for gem/{LOCAL_MATH}, not gem/{gem_id}")
        self._py_state = random.Random(o.seed).getstate()
        self._np_state = np.random.RandomState(o.seed).get_state()
        self.single_turn = gem_id.startswith(("rg:", "math:"))
        with self._rng():
            self.env = self._make()
        self.system_prompt = None  # GEM puts its instructions in the first observation
        self._steps = 0
        self._done = True

    def _make(self) -> Any:
        gem = _quiet_import_gem()
        if self.gem_id == LOCAL_MATH:
            from gem.envs.math_env import MathEnv

            # use_mp: GEM grades in a one-process pool (its alarm-based timeout needs a
            # main thread, which a threaded env worker does not give it).
            return MathEnv(dataset=_load_math(self.options.dataset_path), question_key="problem",
                           answer_key="answer", seed=self.options.seed, use_mp=True)
        from gem.envs.registration import ENV_REGISTRY

        spec = ENV_REGISTRY.get(self.gem_id)
        if spec is None:
            raise ValueError(f"GEM has no env {self.gem_id!r}")
        unknown = sorted(set(self.options.kwargs) - set(spec.kwargs))
        if unknown:
            raise ValueError(
                f"gem/{self.gem_id}: unknown kwargs {unknown}; GEM registered "
                f"{sorted(spec.kwargs) or 'none'} for this id"
            )
        return gem.make(self.gem_id, **self.options.kwargs)

    @contextmanager
    def _rng(self) -> Iterator[None]:
        """Run GEM code on this env's own copy of the global random state."""
        with _GLOBAL_RNG:
            saved_py, saved_np = random.getstate(), np.random.get_state()
            random.setstate(self._py_state)
            np.random.set_state(self._np_state)
            try:
                yield
            finally:
                self._py_state, self._np_state = random.getstate(), np.random.get_state()
                random.setstate(saved_py)
                np.random.set_state(saved_np)

    def _text(self, obs: Any, info: dict[str, Any], first: bool) -> str:
        text = str(obs).replace(_TERMINAL, "(the episode is over)")
        suffix = info.get("suffix") if self.options.append_suffix else None
        if first and self.single_turn:
            suffix = BOXED_HINT
        return f"{text}\n{suffix}" if suffix else text

    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        with self._rng():
            obs, info = self.env.reset(seed=seed)
        self._steps = 0
        self._done = False
        info = dict(info or {})
        return self._text(obs, info, first=True), _plain(info) | {"success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._done:
            raise RuntimeError(f"gem/{self.gem_id}: step() before reset() or after the episode ended")
        self._steps += 1
        with self._rng():
            obs, reward, terminated, truncated, info = self.env.step(str(action))
        terminated, truncated = bool(terminated), bool(truncated)
        if not (terminated or truncated) and self._steps >= self.options.max_steps:
            truncated = True
        self._done = terminated or truncated
        reward = float(reward)
        info = _plain(dict(info or {}))
        info["success"] = bool(self._done and reward >= 1.0)
        return self._text(obs, info, first=False), reward, terminated, truncated, info

    def close(self) -> None:
        pool = getattr(self.env, "mp_pool", None)
        if pool is not None:  # GEM's MathEnv.close() leaves its grading process running
            _terminate(pool)
            return
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _terminate(pool: Any, timeout_s: float = 10.0) -> None:
    """``pool.terminate()`` bounded in time: multiprocessing's terminate joins its task
    handler thread, which can stay blocked (seen in CI under load: the test hung for 300
    s); past ``timeout_s`` the worker processes are killed and the join left behind (a
    daemon thread), so ``close`` always returns."""
    procs = list(getattr(pool, "_pool", []))

    def stop() -> None:
        pool.terminate()
        pool.join()

    t = threading.Thread(target=stop, name="gem-pool-terminate", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        for proc in procs:
            proc.kill()


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    """Keep JSON-able values only (GEM infos may hold arbitrary objects)."""
    out: dict[str, Any] = {}
    for k, v in info.items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[str(k)] = v
        elif isinstance(v, np.generic):
            out[str(k)] = v.item()
        else:
            out[str(k)] = str(v)[:200]
    return out
