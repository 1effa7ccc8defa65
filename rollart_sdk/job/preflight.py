"""Checks that `rollart validate` and `rollart train` run before any worker starts.

What a run would otherwise find only after Ray started (or never, spinning on drops):

- ``check_output_dir``: ``output_dir`` can be created and written to;
- ``check_model``: ``model.path`` is a Hugging Face checkpoint folder whose shape is
  valid (``hidden_size`` divisible by the heads, heads by the KV heads), a ``model.gguf``
  file exists (the tiny model's shape is checked by the config itself); ``validate``
  also reads a GGUF's config and tokenizer from its metadata (``check_gguf``: the shape
  and tokenizer ``train`` gets once it converted the file);
- ``check_env_pools``, ``check_prefill``: a task's ``env_pool`` holds a group,
  prefill-decode disaggregation has an engine that hands K/V over;
- ``check_context``: each task's prompt format can be built (a chat template that
  cannot be rendered turn by turn, ``control/chat.py``, would corrupt every multi-turn
  context), and its ``max_context_tokens`` holds its first prompt (system prompt + the
  env's first observation, env seed 0, through the task's prompt format): a budget that
  cannot hold it drops every trajectory (``no_turns``); ``check_actions``: a task with
  ``constrain_actions`` has an env with action words, each one token;
- each task's env is built once for these checks (:mod:`rollart_sdk.job.env_probe`: its
  facts, then its first observation from the same instance); the run is built
  from what they found (:class:`Preflight`: env facts, model, tokenizer, prompt formats, action token ids);
- for a simulated run (``clock: simulated``) the same checks against the sim's token
  ids and KV cache are :mod:`rollart_sdk.sim.preflight` (``check_sim_context``);
- ``check_model_shape``: the model's shape against the engine's and the trainer's
  parallelism (their options' ``model_problems``, ``rollart_sdk/backends/model_shape.py``:
  a tensor-parallel size that does not divide the heads);
- ``check_precision`` (warnings only): a bfloat16 / float16 ``model.dtype`` trained
  without fp32 master weights (AdamW's small updates round away, silently), or float16
  without loss scaling.

Each returns ``(where, message)`` problems for a :class:`~rollart_sdk.errors.ConfigError`.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollart_sdk.config import ModelConfig, RunConfig
from rollart_sdk.config.schema import looks_like_hub_id
from rollart_sdk.errors import ConfigError
from rollart_sdk.job.env_probe import EnvProbe, Problems, first_observations, probe_envs_checked


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
        hub = (f" (as a Hugging Face Hub id it is not in the local cache either: rollart "
               f"downloads nothing; `hf download {model.path}` puts it there, then this "
               "config finds it)" if looks_like_hub_id(model.path) else "")
        return [("model.path", f"{model.path!r} {what}{hub}; give a Hugging Face checkpoint "
                 "folder (config.json + weights), or model.gguf / model.tiny")]
    try:
        conf = json.loads((p / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return [("model.path", f"{p / 'config.json'} is not readable JSON ({exc})")]
    problems = check_shape(conf, "model.path", str(p / "config.json"), "the checkpoint's config")
    if not any(next(p.glob(pattern), None) for pattern in WEIGHT_FILES):
        problems.append(("model.path", f"{model.path!r} has a config.json and no weights "
                         f"({', '.join(WEIGHT_FILES)}: none there); copy the checkpoint's "
                         "weight files beside it"))
    return problems


# What a Hugging Face checkpoint folder keeps its weights in (one file or shards).
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json")


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
    problems, tokenizer, _ = _read_gguf(model)
    return problems, tokenizer


def _read_gguf(model: ModelConfig) -> tuple[Problems, Any, dict[str, Any] | None]:
    from rollart_sdk.models import read_gguf_meta

    src = model.gguf_path()
    try:
        conf, tokenizer = read_gguf_meta(src)
    except Exception as exc:  # noqa: BLE001 - any reader error is this file's problem
        return [("model.gguf", f"{src}: its config or tokenizer cannot be read "
                 f"({type(exc).__name__}: {str(exc)[:300]}); give a GGUF that transformers "
                 "reads (llama.cpp's convert script writes one)")], None, None
    return check_shape(conf, "model.gguf", str(src), "the GGUF's metadata"), tokenizer, conf


def model_config(model: ModelConfig) -> dict[str, Any] | None:
    """The model's Hugging Face config as a dict: ``config.json`` of ``model.path``, or
    the shape of ``model.tiny`` (``models.build_tiny_checkpoint`` writes it); None for a
    GGUF not yet converted or an unreadable folder (``check_model`` reports that)."""
    if model.path is not None:
        try:
            conf = json.loads((Path(model.path) / "config.json").read_text())
        except (OSError, ValueError):
            return None
        return conf if isinstance(conf, dict) else None
    if model.tiny is None:
        return None
    from rollart_sdk.models import tiny_shape

    return {"model_type": "llama", "hidden_act": "silu", **tiny_shape(model.tiny)}


def check_model_shape(resolved: Any, conf: dict[str, Any] | None) -> Problems:
    """The engine's and the trainer's ``model_problems`` (``rollart_sdk/backends/
    model_shape.py``) for the model's config: a tensor-parallel size that does not
    divide its heads, found here instead of in a worker's constructor."""
    if conf is None:
        return []
    out: Problems = []
    for kind in ("engine", "trainer"):
        chosen = getattr(resolved, kind, None)
        check = getattr(getattr(chosen, "options", None), "model_problems", None)
        if chosen is None or not callable(check):
            continue
        for option, why in check(conf):
            where = f"{kind}.options.{option}" if option else f"{kind}.name"
            out.append((where, f"{kind} {chosen.descriptor.name!r}: {why}"))
    return out


def check_precision(cfg: RunConfig, trainer: Any) -> list[str]:
    """Warnings for a low-precision run: from the trainer's options when they are
    :class:`rollart_sdk.backends.precision.PrecisionOptions` (its ``precision_warnings``), else
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


def system_prompt(task: Any, facts: dict[str, Any]) -> str | None:
    """The task's system prompt: its own, or its env's (``system_prompt: env``)."""
    system = facts["system_prompt"] if task.system_prompt == "env" else task.system_prompt
    return system or None


def task_formats(cfg: RunConfig, described: dict[str, dict[str, Any]],
                 tokenizer: Any) -> tuple[dict[str, Any], Problems, list[str]]:
    """``(formats, problems, warnings)``: each task's prompt format (tag -> format), built
    once here; a chat template that cannot be rendered turn by turn is a problem, what a
    template makes the format do differently from a whole-conversation render a warning."""
    from rollart_sdk.control.chat import task_prompt_format

    formats: dict[str, Any] = {}
    problems: Problems = []
    warnings: list[str] = []
    for i, task in enumerate(cfg.tasks):
        try:
            fmt = task_prompt_format(tokenizer, task, system_prompt(task, described[task.tag]))
        except ValueError as exc:
            where = "chat_template" if task.chat_template and "cannot be read" in str(exc) \
                else "prompt_format"
            problems.append((f"tasks.{i}.{where}", str(exc)))
            continue
        warnings += [f"tasks.{i} ({task.tag}): {note}" for note in fmt.notes]
        if described[task.tag].get("agent"):
            problems += _agent_problems(i, task, fmt)
        formats[task.tag] = fmt
    return formats, problems, warnings


def check_context(cfg: RunConfig, probes: dict[str, EnvProbe],
                  tokenizer: Any) -> tuple[Problems, list[str], dict[str, Any]]:
    """``(problems, warnings, formats)``: each task's prompt format (:func:`task_formats`),
    then its first prompt (system prompt + its env's first observation, from ``probes``)
    against ``max_context_tokens``; a warning when a task's first prompt could not be
    built here (its env did not reset in this process). An agent's prompts are the
    agent's, so its budget is not checked here."""
    described = {tag: p.facts for tag, p in probes.items()}
    formats, problems, warnings = task_formats(cfg, described, tokenizer)
    firsts = {tag: p.first for tag, p in probes.items()}
    for i, task, obs in first_observations(cfg, firsts, warnings):
        if task.tag not in formats or described[task.tag].get("agent"):
            continue
        try:
            n = len(formats[task.tag].first_prompt(obs, system_prompt(task, described[task.tag])))
        except TypeError as exc:  # a non-text observation
            problems.append((f"tasks.{i}.env", f"{exc} (its first observation, seed 0)"))
            continue
        if n >= task.max_context_tokens:
            problems.append((f"tasks.{i}.max_context_tokens", (
                f"{task.max_context_tokens} tokens cannot hold task {task.tag!r}'s first prompt "
                f"({n} tokens: system prompt + the env's first observation, env seed 0), so "
                f"every trajectory would be dropped (no_turns); raise it to at least "
                f"{n + task.sampling.max_new_tokens} (prompt + sampling.max_new_tokens)")))
    return problems, warnings, formats


def check_actions(cfg: RunConfig, described: dict[str, dict[str, Any]],
                  formats: dict[str, Any]) -> tuple[Problems, dict[str, list[int]]]:
    """``(problems, actions)``: for each task with ``constrain_actions``, the token id of
    each word of its env's action vocabulary (tag -> ids); an env without one, or a word
    that is not one token of the model's tokenizer, is a problem."""
    problems: Problems = []
    actions: dict[str, list[int]] = {}
    for i, task in enumerate(cfg.tasks):
        if not task.constrain_actions:
            continue
        vocab = described[task.tag]["action_vocabulary"]
        if not vocab:
            problems.append((f"tasks.{i}.constrain_actions", (
                f"task {task.tag!r}: constrain_actions is set but env {task.env.name!r} has "
                "no action_vocabulary (no action words to sample from); set "
                "constrain_actions: false")))
        elif task.tag in formats:
            try:
                actions[task.tag] = formats[task.tag].action_token_ids(vocab)
            except ValueError as exc:
                problems.append((f"tasks.{i}.constrain_actions", str(exc)))
    return problems, actions


def check_env_pools(cfg: RunConfig) -> Problems:
    """A task's ``env_pool`` must hold one group (0: one environment per trajectory;
    unset: as many as the run keeps busy, always whole groups)."""
    group = cfg.rollout.group_size
    return [(f"tasks.{i}.env_pool", f"{task.env_pool} environments cannot run a group of "
             f"{group}; use at least rollout.group_size, or 0 for one environment per "
             "trajectory")
            for i, task in enumerate(cfg.tasks)
            if task.env_pool is not None and 0 < task.env_pool < group]


def check_prefill(cfg: RunConfig, resolved: Any) -> Problems:
    """Prefill-decode disaggregation (``roles.actor_gen.prefill/decode``) needs an engine
    that hands K/V over (``prefill_kv``). An engine whose stack is not installed here is
    the ``missing`` warning's, not this check's."""
    from rollart_sdk.errors import PluginError

    if not cfg.roles.actor_gen.disaggregated:
        return []
    try:
        engine = resolved.engine.descriptor.load()
    except PluginError:
        return []
    if hasattr(engine, "prefill_kv"):
        return []
    return [("roles.actor_gen.prefill", f"engine {cfg.engine.name!r} cannot hand K/V over "
             "(it has no prefill_kv); use engine torch, or drop roles.actor_gen.prefill/decode")]


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


@dataclass
class Preflight:
    """What the checks found, that the run is built from: each task's env facts (its env
    built once, here), the model (``path`` set when built) and its tokenizer, each task's
    prompt format and, with ``constrain_actions``, its action token ids."""

    described: dict[str, dict[str, Any]]
    model: ModelConfig
    tokenizer: Any
    formats: dict[str, Any] = field(default_factory=dict)
    actions: dict[str, list[int]] = field(default_factory=dict)


def preflight(cfg: RunConfig, resolved: Any, lines: Any = None, log: Any = print,
              build_model: bool = True, output_dir: bool = True) -> Preflight:
    """Every check above, in order, as one ConfigError (with the config's lines): what
    ``rollart validate`` reports and ``rollart train`` runs before any worker starts.

    ``build_model``: prepare the model (build a tiny one, convert a GGUF) as ``train``
    does and read its tokenizer; otherwise (``validate``) a tiny model's tokenizer is
    built alone and a GGUF's config and tokenizer are read from its metadata.
    """

    def fail(problems: Problems) -> None:
        if problems:
            raise ConfigError([(_at(w, lines), m + _path_hint(cfg, w, lines))
                               for w, m in problems])

    fail((check_output_dir(cfg.output_dir) if output_dir else []) + check_model(cfg.model)
         + check_env_pools(cfg) + check_prefill(cfg, resolved))
    # A backend whose heavy stack is not installed: the config is right (validate warns),
    # but a run would fail only after Ray and its workers started.
    missing = list(getattr(resolved, "missing", []))  # (where, said with its line)
    if build_model and missing:
        raise ConfigError(missing)
    for where, why in missing:
        log(f"warning: {where}: {why}")
    fail(check_pd(cfg, resolved))
    for w in (sampling_warnings(cfg) + check_precision(cfg, resolved.trainer)
              + option_clash_warnings(cfg, resolved)):
        log(f"warning: {w}")
    probes, problems = probe_envs_checked(cfg, resolved.envs)
    fail(problems)
    described = {tag: p.facts for tag, p in probes.items()}
    model, tokenizer, problems, conf = _model_and_tokenizer(cfg, described, build_model)
    fail(problems)
    fail(check_model_shape(resolved, conf))
    checked = Preflight(described, model, tokenizer)
    if tokenizer is not None:
        problems, warnings, checked.formats = check_context(cfg, probes, tokenizer)
        for w in warnings:
            log(f"warning: {w}")
        fail(problems)
        problems, checked.actions = check_actions(cfg, described, checked.formats)
        fail(problems)
    return checked


def _model_and_tokenizer(
    cfg: RunConfig, described: dict[str, dict[str, Any]], build_model: bool,
) -> tuple[ModelConfig, Any, Problems, dict[str, Any] | None]:
    """The model (prepared when ``build_model``), its tokenizer and its HF config (a
    dict); a tiny model's tokenizer has the envs' action words as tokens."""
    from rollart_sdk.models import build_tokenizer, load_tokenizer, prepare_model

    extra = sorted({w for d in described.values() for w in (d["action_vocabulary"] or [])})
    # The SDK's own tokenizer for the tiny models it builds, unless the run asks for
    # transformers' (model.implementation): no transformers import for a small run.
    light = cfg.model.implementation != "transformers"
    if build_model:
        model = prepare_model(cfg.model, Path(cfg.output_dir) / ".models", extra)
        assert model.path is not None
        return model, load_tokenizer(model.path, light), [], model_config(model)
    if cfg.model.tiny is not None:
        return cfg.model, build_tokenizer(extra), [], model_config(cfg.model)
    if cfg.model.path is not None:
        return cfg.model, load_tokenizer(cfg.model.path, light), [], model_config(cfg.model)
    # a GGUF: the shape and tokenizer its conversion gives, from its metadata
    problems, tokenizer, conf = _read_gguf(cfg.model)
    return cfg.model, tokenizer, problems, conf


def _path_hint(cfg: RunConfig, where: str, lines: Any) -> str:
    """For a problem with a relative file path in the config (a task's ``chat_template``,
    ``model.path``, ``model.gguf``): paths are read from the working directory, and when
    the path exists from the config file's folder or one of the two above it (the
    examples name theirs from the repository root), where it is."""
    path: str | None = None
    if where.startswith("tasks.") and where.endswith(".chat_template"):
        path = cfg.tasks[int(where.split(".")[1])].chat_template
    elif where == "model.path":
        path = cfg.model.path
    elif where == "model.gguf" and cfg.model.gguf and not cfg.model.gguf.startswith("package:"):
        path = cfg.model.gguf
    if not path or Path(path).expanduser().is_absolute() or Path(path).exists():
        return ""  # found here: the problem is not where it is
    source = getattr(lines, "source", None)
    hint = f" (a relative path is read from the working directory, {Path.cwd()}"
    for base in list(Path(source).resolve().parents)[:3] if source else []:
        if (base / path).exists():
            return f"{hint}; it is {base / path}: run from {base}, or give that path)"
    # model.path may be a Hub id, which that note would only confuse
    return hint + ")" if where.endswith(".chat_template") else ""


def _at(where: str, lines: Any) -> str:
    return str(lines.where(where)) if lines is not None else where
