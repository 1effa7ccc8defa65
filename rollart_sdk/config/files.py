"""Reading a config file safely: UTF-8 text, bounded YAML, no silently repeated keys.

``read_config_file(path)`` -> ``(data, LineMap)``, or a :class:`ConfigError` with one line
that says what, where and how to fix it:

- a file that is not UTF-8 text (a binary, a wrong path);
- YAML aliases that expand past ``MAX_NODES`` nodes (an "alias bomb": a 1.5 KB file can
  stand for billions of values) or refer to themselves; the expansion is counted on the
  parsed node graph (each node once), so the check itself is bounded;
- a key repeated in one mapping (YAML's last-wins would silently drop the first);
- malformed YAML (with its line and column).

The file is parsed once; the data and the line map come from the same node tree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rollart_sdk.errors import ConfigError

MAX_NODES = 100_000  # values a config may expand to (a large config has a few thousand)
_MERGE = "tag:yaml.org,2002:merge"


class LineMap:
    """Dotted key path -> 1-based YAML line, built from the YAML node tree."""

    def __init__(self, lines: dict[str, int] | None = None) -> None:
        self.lines = lines or {}
        # Dotted key -> the command-line override that set it (``key=value``): an error
        # at or under that key cites the override, not the YAML line of the key.
        self.overrides: dict[str, str] = {}
        self.source: str | None = None  # the config file (load_config), for path hints

    @classmethod
    def from_yaml(cls, text: str) -> LineMap:
        return cls.from_node(yaml.compose(text))

    @classmethod
    def from_node(cls, root: yaml.Node | None) -> LineMap:
        """From a node tree already checked to be bounded (config_file.read_config_file)."""
        lines: dict[str, int] = {}

        def walk(node: yaml.Node, path: str) -> None:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    p = f"{path}.{k.value}" if path else str(k.value)
                    lines[p] = k.start_mark.line + 1
                    walk(v, p)
            elif isinstance(node, yaml.SequenceNode):
                for i, v in enumerate(node.value):
                    p = f"{path}.{i}" if path else str(i)
                    lines[p] = v.start_mark.line + 1
                    walk(v, p)

        if root is not None:
            walk(root, "")
        return cls(lines)

    def override_of(self, path: str) -> str | None:
        """The command-line override that set ``path`` or one of its ancestors, or None."""
        parts = path.split(".")
        while parts:
            item = self.overrides.get(".".join(parts))
            if item is not None:
                return item
            parts.pop()
        return None

    def where(self, path: str) -> str:
        """``path`` with where its value came from: ``(from the command line: k=v)`` when an
        override set it, else ``(line N)`` of the YAML file when known."""
        item = self.override_of(path)
        if item is not None:
            return f"{path} (from the command line: {item})"
        line = self.line_of(path)
        return f"{path} (line {line})" if line else path

    def line_of(self, path: str) -> int | None:
        """The line of ``path`` or of its nearest ancestor present in the file."""
        parts = path.split(".")
        while parts:
            line = self.lines.get(".".join(parts))
            if line:
                return line
            parts.pop()
        return None


def read_config_file(path: str | Path) -> tuple[Any, Any]:
    source = str(path)
    p = Path(path)
    if p.is_dir():
        hint = (f"; a run directory's config is {p / 'config.yaml'}"
                if (p / "config.yaml").is_file() else "")
        raise ConfigError([(source, f"a folder, not a config file: give the YAML file{hint}")],
                          source)
    if not p.is_file():
        raise ConfigError([(source, "no such file")], source)
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([(source, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
                            f"{exc.start}); a config is a YAML text file: check the path, or "
                            "save the file as UTF-8")], source) from None
    try:
        data, node = parse_yaml(text, source)
    except yaml.YAMLError as exc:
        raise ConfigError([(_where(exc), f"malformed YAML: {_problem(exc)}")], source) from None
    return data, LineMap.from_node(node)


def parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """``(data, node tree)`` of one YAML document, bounded and without repeated keys
    (a ConfigError otherwise); malformed YAML raises ``yaml.YAMLError``."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check(node, source)
        return loader.construct_document(node), node
    finally:
        loader.dispose()


def _check(root: yaml.Node, source: str) -> None:
    """Count the expanded size (each node once, memoised); refuse cycles, repeated keys."""
    sizes: dict[int, int] = {}
    busy: set[int] = set()
    # Iterative post-order walk: deep nesting cannot overflow the stack.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            busy.discard(key)
            total = 1 + sum(sizes[id(c)] for c in _children(node))
            if total > MAX_NODES:
                raise ConfigError([(f"line {node.start_mark.line + 1}", (
                    f"YAML aliases here expand to more than {MAX_NODES:,} values (an alias "
                    "bomb?); write the values out, or use fewer nested aliases (*name)"))],
                    source)
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in busy:
            raise ConfigError([(f"line {node.start_mark.line + 1}", (
                "a YAML alias refers to the value that contains it (a cycle); a config "
                "must be a tree: replace the alias with the values"))], source)
        busy.add(key)
        if isinstance(node, yaml.MappingNode):
            _repeated_keys(node, source)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _repeated_keys(node: yaml.MappingNode, source: str) -> None:
    seen: dict[str, int] = {}
    for k, _ in node.value:
        if not isinstance(k, yaml.ScalarNode) or k.tag == _MERGE:
            continue
        line = k.start_mark.line + 1
        if k.value in seen:
            raise ConfigError([(f"line {line}", (
                f"key {k.value!r} appears twice in this mapping (first at line "
                f"{seen[k.value]}); YAML would silently keep the last one: delete one of "
                "them"))], source)
        seen[k.value] = line


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"


def _problem(exc: yaml.YAMLError) -> str:
    problem = getattr(exc, "problem", None) or str(exc)
    ctx, ctx_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if ctx and ctx_mark:
        problem += f" ({ctx} at line {ctx_mark.line + 1}, column {ctx_mark.column + 1})"
    return str(problem)
