"""Dotted command-line overrides (``rollout.alpha=2``) applied to a config's data before it
is validated; each value is parsed as YAML."""

from __future__ import annotations

import re
from typing import Any

import yaml

from rollart_sdk.config.files import parse_yaml
from rollart_sdk.errors import ConfigError


def parse_override(item: str) -> tuple[list[str], Any]:
    """``rollout.alpha=2`` -> (["rollout", "alpha"], 2); the value is parsed as YAML. A list
    item is ``tasks.0`` or ``tasks[0]`` (as the docs write ``tasks[].max_turns``)."""
    if "=" not in item:
        raise ConfigError([(item, "an override must look like key.path=value (e.g. rollout.alpha=2)")])
    key, _, raw = item.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError([(item, "empty key in override")])
    try:
        value = parse_yaml(raw, f"override {key}")[0] if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError([(key, f"override value {raw!r} is not valid YAML: {_yaml_problem(exc)}; "
                                 "write a YAML value, quoted for the shell: 'key=[1, 2]'")]) from None
    return re.sub(r"\[(\d+)\]", r".\1", key).split("."), value


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error in a short text (an override): what is wrong and at
    which column, without the parser's quoted source lines and carets."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at column {mark.column + 1}" if mark is not None else problem


def apply_override(data: dict[str, Any], path: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(path[:-1]):
        nxt = _child(node, part, path[: i + 1])
        if nxt is None:
            nxt = {}
            _set_child(node, part, nxt, path[: i + 1])
        node = nxt
    _set_child(node, path[-1], value, path)


def _child(node: Any, part: str, where: list[str]) -> Any:
    if isinstance(node, list):
        idx = _index(part, node, where)
        return node[idx]
    if isinstance(node, dict):
        return node.get(part)
    raise ConfigError([(".".join(where), f"cannot descend into a {type(node).__name__}")])


def _set_child(node: Any, part: str, value: Any, where: list[str]) -> None:
    if isinstance(node, list):
        node[_index(part, node, where)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ConfigError([(".".join(where), f"cannot set a key inside a {type(node).__name__}")])


def _index(part: str, node: list, where: list[str]) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            [(".".join(where), f"list index must be 0..{len(node) - 1}, got {part!r}")]
        )
    return int(part)
