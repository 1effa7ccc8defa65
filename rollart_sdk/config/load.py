"""``load_config``: a run config from its YAML file (or data), the overrides applied,
validated by the schema; every problem reported with its key and YAML line::

    invalid configuration in examples/quickstart.yaml:
      rollout.alpha (line 41): Input should be greater than or equal to 0 (got -1)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rollart_sdk.config.files import LineMap, read_config_file
from rollart_sdk.config.overrides import apply_override, parse_override
from rollart_sdk.config.schema import RunConfig
from rollart_sdk.errors import ConfigError


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    data: dict[str, Any] | None = None,
) -> tuple[RunConfig, LineMap]:
    """Load and validate a run config from YAML (or ``data``, left as it is), applying
    dotted overrides."""
    source = str(path) if path is not None else None
    lines = LineMap()
    if data is not None:
        data = copy.deepcopy(data)  # the overrides go into a copy, not the caller's dict
    else:
        if path is None:
            raise ValueError("give a path or data")
        data, lines = read_config_file(path)
        lines.source = source
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError([("(top level)", "a config must be a mapping of keys")], source)
    for item in overrides or []:
        keys, value = parse_override(item)
        apply_override(data, keys, value)
        lines.overrides[".".join(keys)] = item.strip()
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            problems.append((lines.where(loc), _describe(err)))
        raise ConfigError(problems, source) from None
    cross = cfg.cross_check()
    if cross:
        raise ConfigError([(lines.where(w), m) for w, m in cross], source)
    return cfg, lines


def _describe(err: Mapping[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown key (check the spelling; see docs/configuration.md for the keys)"
    if err["type"] == "literal_error":
        return f"{msg} (got {err.get('input')!r})"
    if err["type"] != "missing" and "input" in err and not isinstance(err["input"], dict | list):
        return f"{msg} (got {_short(err['input'])})"
    return msg


def _short(value: Any, limit: int = 120) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error names the value, it does not
    dump a whole section of the config."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
