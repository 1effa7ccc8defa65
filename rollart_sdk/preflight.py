"""Checks that `rollart validate` and `rollart train` run before any worker starts.

What a run would otherwise find only after Ray started (or never, spinning on drops):

- ``check_output_dir``: ``output_dir`` can be created and written to;
- ``check_model``: ``model.path`` is a Hugging Face checkpoint folder whose shape is
  valid (``hidden_size`` divisible by the heads, heads by the KV heads), a ``model.gguf``
  file exists (the tiny model's shape is checked by the config itself);
- ``check_context``: each task's ``max_context_tokens`` holds its first prompt (system
  prompt + the env's first observation, env seed 0, through the task's prompt format):
  a budget that cannot hold it drops every trajectory (``no_turns``).

Each returns ``(where, message)`` problems for a :class:`~rollart_sdk.errors.ConfigError`.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from rollart_sdk.config import ModelConfig, RunConfig

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
    hidden, heads = conf.get("hidden_size"), conf.get("num_attention_heads")
    kv = conf.get("num_key_value_heads") or heads
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if hidden % heads and conf.get("head_dim") is None:
            return [("model.path", f"{p / 'config.json'}: hidden_size {hidden} is not divisible "
                     f"by num_attention_heads {heads}; fix the checkpoint's config")]
        if isinstance(kv, int) and kv > 0 and heads % kv:
            return [("model.path", f"{p / 'config.json'}: num_attention_heads {heads} is not "
                     f"divisible by num_key_value_heads {kv}; fix the checkpoint's config")]
    return []


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


def check_context(cfg: RunConfig, envs: dict[str, Any], described: dict[str, dict[str, Any]],
                  tokenizer: Any) -> tuple[Problems, list[str]]:
    """``(problems, warnings)``: a warning when a task's first prompt could not be built
    here (its env did not reset in this process)."""
    from rollart_sdk.control.chat import prompt_format

    problems: Problems = []
    warnings: list[str] = []
    for i, task in enumerate(cfg.tasks):
        res = envs[task.tag]
        obs = first_observation(res.descriptor.load(), res.options.model_dump(),
                                task.reset_timeout_s)
        if isinstance(obs, BaseException):
            warnings.append(f"tasks.{i}: context budget not checked: the env's reset failed "
                            f"here ({type(obs).__name__}: {str(obs)[:200]})")
            continue
        system = described[task.tag]["system_prompt"] if task.system_prompt == "env" \
            else task.system_prompt
        try:
            n = len(prompt_format(tokenizer, task.prompt_format).first_prompt(str(obs),
                                                                             system or None))
        except ValueError:
            continue  # a bad prompt_format: reported where the format is built
        if n >= task.max_context_tokens:
            problems.append((f"tasks.{i}.max_context_tokens", (
                f"{task.max_context_tokens} tokens cannot hold task {task.tag!r}'s first prompt "
                f"({n} tokens: system prompt + the env's first observation, env seed 0), so "
                f"every trajectory would be dropped (no_turns); raise it to at least "
                f"{n + task.sampling.max_new_tokens} (prompt + sampling.max_new_tokens)")))
    return problems, warnings


def preflight(cfg: RunConfig, resolved: Any, lines: Any = None, log: Any = print,
              build_model: bool = True, output_dir: bool = True) -> dict[str, Any]:
    """Every check above, in order, as one ConfigError (with the config's lines).

    ``build_model``: prepare the model (build a tiny one, convert a GGUF) as ``train``
    does and read its tokenizer; otherwise (``validate``) a tiny model's tokenizer is
    built alone and a GGUF's context check is skipped. Returns ``described`` (each
    task's env facts), ``model`` (with ``path`` set when built) and ``tokenizer``.
    """
    from rollart_sdk.errors import ConfigError
    from rollart_sdk.job import describe_env
    from rollart_sdk.models import build_tokenizer, load_tokenizer, prepare_model

    def fail(problems: Problems) -> None:
        if problems:
            raise ConfigError([(_at(w, lines), m) for w, m in problems])

    fail((check_output_dir(cfg.output_dir) if output_dir else []) + check_model(cfg.model))
    described = {tag: describe_env(res) for tag, res in resolved.envs.items()}
    extra = sorted({w for d in described.values() for w in (d["action_vocabulary"] or [])})
    model, tokenizer = cfg.model, None
    if build_model:
        model = prepare_model(cfg.model, Path(cfg.output_dir) / ".models", extra)
        assert model.path is not None
        tokenizer = load_tokenizer(model.path)
    elif cfg.model.tiny is not None:
        tokenizer = build_tokenizer(extra)
    elif cfg.model.path is not None:
        tokenizer = load_tokenizer(cfg.model.path)
    else:
        log("note: context budgets not checked (the GGUF's tokenizer is read when "
            "`rollart train` converts it)")
    if tokenizer is not None:
        problems, warnings = check_context(cfg, resolved.envs, described, tokenizer)
        for w in warnings:
            log(f"warning: {w}")
        fail(problems)
    return {"described": described, "model": model, "tokenizer": tokenizer}


def _at(where: str, lines: Any) -> str:
    line = lines.line_of(where) if lines is not None else None
    return f"{where} (line {line})" if line else where
