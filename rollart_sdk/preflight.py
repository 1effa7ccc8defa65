"""Checks that `rollart validate` and `rollart train` run before any worker starts.

What a run would otherwise find only after Ray started (or never, spinning on drops):

- ``check_output_dir``: ``output_dir`` can be created and written to;
- ``check_model``: ``model.path`` is a Hugging Face checkpoint folder whose shape is
  valid (``hidden_size`` divisible by the heads, heads by the KV heads), a ``model.gguf``
  file exists (the tiny model's shape is checked by the config itself); ``validate``
  also reads a GGUF's config and tokenizer from its metadata (``check_gguf``: the shape
  and tokenizer ``train`` gets once it converted the file);
- ``check_context``: each task's prompt format can be built (a chat template that
  cannot be rendered turn by turn, ``control/chat.py``, would corrupt every multi-turn
  context), and its ``max_context_tokens`` holds its first prompt (system prompt + the
  env's first observation, env seed 0, through the task's prompt format): a budget that
  cannot hold it drops every trajectory (``no_turns``);
- for a simulated run (``clock: simulated``) the same checks against the sim's token
  ids and KV cache are :mod:`rollart_sdk.sim.preflight` (``check_sim_context``);
- ``check_precision`` (warnings only): a bfloat16 / float16 ``model.dtype`` trained
  without fp32 master weights (AdamW's small updates round away, silently), or float16
  without loss scaling.

Each returns ``(where, message)`` problems for a :class:`~rollart_sdk.errors.ConfigError`.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollart_sdk.config import ModelConfig, RunConfig

if TYPE_CHECKING:
    from rollart_sdk.resolve import Resolved

Problems = list[tuple[str, str]]


def check_output_dir(path: str) -> Problems:
    """The nearest existing folder of ``path`` must let us create ``path`` in it."""
    p = Path(path).expanduser()
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if p.exists() and not p.is_dir():
        return [("output_dir", f"{path!r} is a file, not a folder; give a folder for runs")]
    if not existing.is_dir():
        return [("output_dir", f"{path!r}: {existing} is a file, not a folder")]
    try:  # the real test (permissions, read-only or pseudo file systems): make, remove
        tempfile.TemporaryDirectory(dir=existing, prefix=".rollart-check-").cleanup()
    except OSError as exc:
        return [("output_dir", f"{path!r} cannot be created or written ({exc.strerror or exc} "
                 f"in {existing}); choose a writable folder (output_dir=...)")]
    return []


def check_model(model: ModelConfig) -> Problems:
    if model.gguf is not None:
        src = model.gguf_path()
        if not src.is_file():
            return [("model.gguf", f"file not found: {src}")]
        return []
    if model.path is None:
        return []
    p = Path(model.path)
    if not (p / "config.json").is_file():
        what = "does not exist" if not p.exists() else "has no config.json"
        return [("model.path", f"{model.path!r} {what}; give a Hugging Face checkpoint folder "
                 "(config.json + weights), or model.gguf / model.tiny")]
    try:
        conf = json.loads((p / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [("model.path", f"{p / 'config.json'} is not readable JSON ({exc})")]
    return check_shape(conf, "model.path", str(p / "config.json"), "the checkpoint's config")


def check_shape(conf: dict[str, Any], where: str, source: str, fix: str) -> Problems:
    """A model config's attention shape: hidden size divisible by the heads (unless
    ``head_dim`` is given), heads by the KV heads."""
    hidden, heads = conf.get("hidden_size"), conf.get("num_attention_heads")
    kv = conf.get("num_key_value_heads") or heads
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if hidden % heads and conf.get("head_dim") is None:
            return [(where, f"{source}: hidden_size {hidden} is not divisible by "
                     f"num_attention_heads {heads}; fix {fix}")]
        if isinstance(kv, int) and kv > 0 and heads % kv:
            return [(where, f"{source}: num_attention_heads {heads} is not divisible by "
                     f"num_key_value_heads {kv}; fix {fix}")]
    return []


def check_gguf(model: ModelConfig) -> tuple[Problems, Any]:
    """``(problems, tokenizer)``: the config and tokenizer a GGUF file converts to, read
    from its metadata (``rollart_sdk.models.read_gguf_meta``, the calls ``convert_gguf``
    makes, without dequantising the weights)."""
    from rollart_sdk.models import read_gguf_meta

    src = model.gguf_path()
    try:
        conf, tokenizer = read_gguf_meta(src)
    except Exception as exc:  # noqa: BLE001 - any reader error is this file's problem
        return [("model.gguf", f"{src}: its config or tokenizer cannot be read "
                 f"({type(exc).__name__}: {str(exc)[:300]}); give a GGUF that transformers "
                 "reads (llama.cpp's convert script writes one)")], None
    return check_shape(conf, "model.gguf", str(src), "the GGUF's metadata"), tokenizer


def check_precision(cfg: RunConfig, trainer: Any) -> list[str]:
    """Warnings for a low-precision run: from the trainer's options when they are
    :class:`rollart_sdk.precision.PrecisionOptions` (its ``precision_warnings``), else
    that the trainer does not say whether it keeps fp32 master weights."""
    dtype = cfg.model.dtype
    if dtype == "float32":
        return []
    options = trainer.options
    warn = getattr(options, "precision_warnings", None)
    if callable(warn):
        return list(warn(dtype, "trainer.options"))
    name = trainer.descriptor.name
    return [f"model.dtype is {dtype} and trainer {name!r} has no master_weights option: "
            f"if it steps the {dtype} weights directly, updates smaller than their resolution "
            "(most updates at RL learning rates) round away without any error; check the "
            "trainer's documentation, or use model.dtype float32"]


def first_observation(env_cls: Any, options: dict[str, Any], timeout: float) -> Any:
    """The env's first observation (seed 0), or an exception; bounded by ``timeout``."""
    box: dict[str, Any] = {}

    def run() -> None:
        env = None
        try:
            env = env_cls(**options)
            box["obs"] = env.reset(seed=0)[0]
        except Exception as exc:  # noqa: BLE001 - reported by the caller as a skipped check
            box["error"] = exc
        finally:
            close = getattr(env, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - the check's env only; train reports its own
                    pass

    t = threading.Thread(target=run, daemon=True, name="preflight-reset")
    t.start()
    t.join(timeout)
    if t.is_alive():
        return TimeoutError(f"reset took longer than {timeout:g}s")
    return box.get("error", box.get("obs"))


def _first_observations(cfg: RunConfig, envs: dict[str, Any],
                        warnings: list[str]) -> Iterator[tuple[int, Any, Any]]:
    """``(index, task, first observation)`` of each task whose env resets here (seed 0,
    within the task's ``reset_timeout_s``); for one that does not, a warning that its
    context budget is not checked."""
    for i, task in enumerate(cfg.tasks):
        res = envs[task.tag]
        obs = first_observation(res.descriptor.load(), res.options.model_dump(),
                                task.reset_timeout_s)
        if isinstance(obs, BaseException):
            warnings.append(f"tasks.{i}: context budget not checked: the env's reset failed "
                            f"here ({type(obs).__name__}: {str(obs)[:200]})")
            continue
        yield i, task, obs


def check_context(cfg: RunConfig, envs: dict[str, Any], described: dict[str, dict[str, Any]],
                  tokenizer: Any) -> tuple[Problems, list[str]]:
    """``(problems, warnings)``: each task's prompt format is built (a chat template that
    cannot be rendered turn by turn is a problem; what a template makes the format do
    differently from a whole-conversation render is a warning), then its first prompt
    is checked against ``max_context_tokens``; a warning when a task's first prompt
    could not be built here (its env did not reset in this process)."""
    from rollart_sdk.control.chat import task_prompt_format

    problems: Problems = []
    warnings: list[str] = []
    formats: dict[int, Any] = {}
    systems: dict[int, str | None] = {}
    for i, task in enumerate(cfg.tasks):
        system = described[task.tag]["system_prompt"] if task.system_prompt == "env" \
            else task.system_prompt
        systems[i] = system or None
        try:
            formats[i] = task_prompt_format(tokenizer, task, systems[i])
        except ValueError as exc:
            where = "chat_template" if task.chat_template and "cannot be read" in str(exc) \
                else "prompt_format"
            problems.append((f"tasks.{i}.{where}", str(exc)))
            continue
        warnings += [f"tasks.{i} ({task.tag}): {note}" for note in formats[i].notes]
        if described[task.tag].get("agent"):
            problems += _agent_problems(i, task, formats.pop(i))
    for i, task, obs in _first_observations(cfg, envs, warnings):
        if i not in formats:
            continue
        try:
            n = len(formats[i].first_prompt(obs, systems[i]))
        except TypeError as exc:  # a non-text observation
            problems.append((f"tasks.{i}.env", f"{exc} (its first observation, seed 0)"))
            continue
        if n >= task.max_context_tokens:
            problems.append((f"tasks.{i}.max_context_tokens", (
                f"{task.max_context_tokens} tokens cannot hold task {task.tag!r}'s first prompt "
                f"({n} tokens: system prompt + the env's first observation, env seed 0), so "
                f"every trajectory would be dropped (no_turns); raise it to at least "
                f"{n + task.sampling.max_new_tokens} (prompt + sampling.max_new_tokens)")))
    return problems, warnings


def _agent_problems(i: int, task: Any, fmt: Any) -> Problems:
    """An agent task (its env an ``AgentEnv``) renders OpenAI messages with a chat
    template, and its agent waits on the gateway, which the control plane's loop serves."""
    from rollart_sdk.control.chat import ChatFormat

    problems: Problems = []
    if not isinstance(fmt, ChatFormat):
        problems.append((f"tasks.{i}.prompt_format", (
            f"task {task.tag!r} is an agent: its requests are rendered with a chat template, "
            "and this model's tokenizer has none; use a model with a chat template, or give "
            "one (tasks[].chat_template: a .jinja file)")))
    import importlib.util

    if importlib.util.find_spec("openai") is None:
        problems.append((f"tasks.{i}.env", (
            f"task {task.tag!r} is an agent, and its client library is not installed: "
            "pip install 'rollart-sdk[agents]' (or pip install openai)")))
    if task.env_host == "inline":
        problems.append((f"tasks.{i}.env_host", (
            f"task {task.tag!r} is an agent: it cannot run inline (it would block the loop "
            "that serves its requests); use env_host: worker (default) or thread")))
    return problems


def check_pd(cfg: RunConfig, resolved: Any) -> Problems:
    """Prefill-decode disaggregation needs an engine that hands K/V over (``prefill_kv``;
    engine ``torch`` does, vLLM and SGLang do not)."""
    if not cfg.roles.actor_gen.disaggregated or resolved.engine is None:
        return []
    try:
        engine_cls = resolved.engine.descriptor.load()
    except ImportError:  # its stack is not installed: reported as missing
        return []
    if hasattr(engine_cls, "prefill_kv"):
        return []
    return [("roles.actor_gen.prefill", f"engine {cfg.engine.name!r} cannot hand K/V over "
             "(it has no prefill_kv); use engine torch, or drop roles.actor_gen.prefill/"
             "decode")]


def sampling_warnings(cfg: RunConfig) -> list[str]:
    """Tasks that sample with top-k or top-p: the tokens come from a truncated
    distribution, while engines report and trainers optimise the untruncated policy
    (temperature and action mask, :mod:`rollart_sdk.algorithms.policy`), as in verl."""
    out = []
    for i, task in enumerate(cfg.tasks):
        s = task.sampling
        if s.temperature > 0 and (s.top_k > 0 or s.top_p < 1.0):
            out.append(
                f"tasks.{i}.sampling: top_k={s.top_k}, top_p={s.top_p} truncate the "
                "distribution the tokens are drawn from, but the trained policy is the "
                "untruncated softmax(logits / temperature), and the importance ratios do "
                "not see the truncation. For RL set top_k: 0 and top_p: 1.0"
            )
    return out


def option_clash_warnings(cfg: RunConfig, resolved: Any) -> list[str]:
    """An env or reward option named like a task key (an env option ``max_turns`` next to
    ``tasks[].max_turns``): two settings that read as one, so setting one and expecting
    the other is an easy mistake. The plugin should rename its option."""
    from rollart_sdk.config import TaskConfig

    out = []
    for i, task in enumerate(cfg.tasks):
        for kind, chosen in (("env", resolved.envs), ("reward", resolved.rewards)):
            res = chosen.get(task.tag)
            if res is None:
                continue
            for key in sorted(set(type(res.options).model_fields) & set(TaskConfig.model_fields)):
                out.append(
                    f"tasks.{i}.{kind}.options: {kind} {res.descriptor.name!r} "
                    f"({res.descriptor.origin}) has an option {key!r}, the name of the task "
                    f"key tasks.{i}.{key}; they are two settings (the task's "
                    f"{key}={getattr(task, key)!r} is not the {kind}'s). Set both as you mean "
                    f"them; the plugin should rename its option")
    return out


def describe_env(resolved: Resolved) -> dict[str, Any]:
    """Build one env in this process to read its action vocabulary and instructions."""
    env = resolved.descriptor.load()(**resolved.options.model_dump())
    try:
        return {
            "action_vocabulary": getattr(env, "action_vocabulary", None),
            "system_prompt": getattr(env, "system_prompt", None),
            "step_cost": getattr(env, "step_cost", None),
            # An AgentEnv (rollart_sdk.gateway): the agent drives, through the gateway.
            "agent": bool(getattr(env, "is_agent", False)),
            "tool_parser": getattr(env, "tool_parser", None) or "hermes",
        }
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def preflight(cfg: RunConfig, resolved: Any, lines: Any = None, log: Any = print,
              build_model: bool = True, output_dir: bool = True) -> dict[str, Any]:
    """Every check above, in order, as one ConfigError (with the config's lines).

    ``build_model``: prepare the model (build a tiny one, convert a GGUF) as ``train``
    does and read its tokenizer; otherwise (``validate``) a tiny model's tokenizer is
    built alone and a GGUF's config and tokenizer are read from its metadata. Returns ``described`` (each
    task's env facts), ``model`` (with ``path`` set when built) and ``tokenizer``.
    """
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.models import build_tokenizer, load_tokenizer, prepare_model

    def fail(problems: Problems) -> None:
        if problems:
            raise ConfigError([(_at(w, lines), m) for w, m in problems])

    fail((check_output_dir(cfg.output_dir) if output_dir else []) + check_model(cfg.model))
    # A backend whose heavy stack is not installed: the config is right (validate warns),
    # but a run would fail only after Ray and its workers started.
    missing = list(getattr(resolved, "missing", []))
    if build_model:
        fail(missing)
    for where, why in missing:
        log(f"warning: {where}: {why}")
    fail(check_pd(cfg, resolved))
    for w in (sampling_warnings(cfg) + check_precision(cfg, resolved.trainer)
              + option_clash_warnings(cfg, resolved)):
        log(f"warning: {w}")
    described = {tag: describe_env(res) for tag, res in resolved.envs.items()}
    extra = sorted({w for d in described.values() for w in (d["action_vocabulary"] or [])})
    model, tokenizer = cfg.model, None
    # The SDK's own tokenizer for the tiny models it builds, unless the run asks for
    # transformers' (model.implementation): no transformers import for a small run.
    light = cfg.model.implementation != "transformers"
    if build_model:
        model = prepare_model(cfg.model, Path(cfg.output_dir) / ".models", extra)
        assert model.path is not None
        tokenizer = load_tokenizer(model.path, light)
    elif cfg.model.tiny is not None:
        tokenizer = build_tokenizer(extra)
    elif cfg.model.path is not None:
        tokenizer = load_tokenizer(cfg.model.path, light)
    else:  # a GGUF: the shape and tokenizer its conversion gives, from its metadata
        problems, tokenizer = check_gguf(cfg.model)
        fail(problems)
    if tokenizer is not None:
        problems, warnings = check_context(cfg, resolved.envs, described, tokenizer)
        for w in warnings:
            log(f"warning: {w}")
        fail(problems)
    return {"described": described, "model": model, "tokenizer": tokenizer}


def _at(where: str, lines: Any) -> str:
    return str(lines.where(where)) if lines is not None else where
