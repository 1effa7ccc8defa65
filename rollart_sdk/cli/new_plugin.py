"""``rollart new-plugin KIND NAME [DIR]``: write a ready plugin package.

DIR is the package folder to create (default ``./rollart-<kind>-<name>``; it must not exist
or be empty). It holds a pyproject with the entry point, an options model, a working
backend to replace with yours, a README and a test running the kind's conformance kit;
``pip install -e DIR && pytest DIR`` passes unchanged (tests/test_new_plugin.py checks that
for every kind it offers).

The files are real ones, checked by ruff and mypy with the rest of the SDK:
``rollart_sdk/templates/rollart-<kind>-example/`` is the package folder of the kind's
plugin named ``example`` (package ``rollart_<kind>_example``, classes ``Example<Suffix>``,
options ``ExampleOptions``; ``tests/test_example.py``); :func:`render` copies it and renames
``example`` / ``Example`` (whole identifiers) to the new name. ``pyproject.toml.tmpl`` and
``README.md.tmpl`` (beside the folders) and each folder's ``how.md`` (the README's "How it
works") are plain text with ``{placeholders}``.
"""

from __future__ import annotations

import argparse
import keyword
import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from rollart_sdk.errors import RollartError

KIND_HOOK = {
    "env": ("rollart_register_envs", "env.py", "Env"),
    "reward": ("rollart_register_rewards", "reward.py", "Reward"),
    "transport": ("rollart_register_transports", "transport.py", "Transport"),
    "placement": ("rollart_register_placements", "placement.py", "Placement"),
    "benchmark": ("rollart_register_benchmarks", "bench.py", "Bench"),
    "engine": ("rollart_register_engines", "engine.py", "Engine"),
    "trainer": ("rollart_register_trainers", "trainer.py", "Trainer"),
    "serverless_scheme": ("rollart_register_serverless_schemes", "scheme.py", "Caller"),
}
# Dependencies beyond rollart-sdk, pydantic and gymnasium, per kind (the pyproject's).
DEPS = {"trainer": ', "torch>=2.2", "transformers>=4.45"', "engine": ', "torch>=2.2"'}
PLACEHOLDER = "example"  # the templates' plugin name


def templates() -> Traversable:
    """The folder of templates (``rollart_sdk/templates``), installed or in a checkout."""
    return resources.files("rollart_sdk").joinpath("templates")


def _names(kind: str, name: str) -> dict[str, str]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise RollartError(f"plugin name {name!r}: use lower-case letters, digits and _ "
                           "(it becomes part of a Python package name)")
    slug = kind.replace("_", "-")
    hook, module, suffix = KIND_HOOK[kind]
    camel = "".join(part.capitalize() for part in name.split("_"))
    return {
        "kind": kind, "name": name, "dist": f"rollart-{slug}-{name.replace('_', '-')}",
        "package": f"rollart_{kind}_{name}", "hook": hook, "module": module[:-3],
        "cls": camel + suffix, "options": camel + "Options", "camel": camel,
        "deps": DEPS.get(kind, ""),
    }


def rename(text: str, kind: str, names: dict[str, str]) -> str:
    """The template's identifiers renamed: ``rollart_<kind>_example`` and
    ``rollart-<kind>-example`` to the package and distribution, ``Example...`` to the
    camel-cased name, and ``example`` wherever it stands alone (``test_example``,
    ``"example"``, ``example://``) to the name."""
    slug = kind.replace("_", "-")
    text = text.replace(f"rollart_{kind}_{PLACEHOLDER}", names["package"])
    text = text.replace(f"rollart-{slug}-{PLACEHOLDER}", names["dist"])
    text = re.sub(r"(?<![A-Za-z0-9])Example(?=[A-Z]|\b)", names["camel"], text)
    return re.sub(r"(?<![A-Za-z0-9])example(?![A-Za-z0-9])", names["name"], text)


def _fill(text: str, names: dict[str, str]) -> str:
    for key, value in names.items():
        text = text.replace("{" + key + "}", value)
    return text


def _tree(folder: Traversable, prefix: str = "") -> dict[str, str]:
    """Relative path -> text of every file under ``folder`` (no caches)."""
    files: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__" or entry.name.endswith(".pyc"):
            continue
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            files.update(_tree(entry, rel + "/"))
        else:
            files[rel] = entry.read_text()
    return files


def render(kind: str, name: str) -> dict[str, str]:
    """Relative path -> text of every file of the new package."""
    if kind not in KIND_HOOK:
        raise RollartError(f"no template for kind {kind!r}; kinds: {', '.join(KIND_HOOK)}")
    n = _names(kind, name)
    root = templates()
    kind_files = _tree(root.joinpath(f"rollart-{kind.replace('_', '-')}-{PLACEHOLDER}"))
    n["how"] = _fill(rename(kind_files.pop("how.md").strip(), kind, n), n)
    files = {
        "pyproject.toml": _fill(root.joinpath("pyproject.toml.tmpl").read_text(), n),
        "README.md": _fill(root.joinpath("README.md.tmpl").read_text(), n),
    }
    for rel, text in kind_files.items():
        files[rename(rel, kind, n)] = rename(text, kind, n)
    return files


def write(kind: str, name: str, directory: str | Path | None = None) -> Path:
    """Write the package into ``directory`` (the package folder itself; default
    ``./rollart-<kind>-<name>``) and return it."""
    files = render(kind, name)
    root = Path(directory if directory is not None else _names(kind, name)["dist"])
    if root.exists() and not root.is_dir():
        raise RollartError(f"{root} is a file; DIR is the package folder to create")
    if root.exists() and any(root.iterdir()):
        raise RollartError(f"{root} exists and is not empty; DIR is the package folder to "
                           "create: name a new or empty folder")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def taken_by(kind: str, name: str) -> str | None:
    """The installed plugin that already registers ``kind`` ``name`` (None: the name is
    free here). A second package with it would make every config selecting the name fail
    ("registered twice"), after its own tests passed."""
    from rollart_sdk.plugins import load_plugins

    registry = load_plugins(strict=False).registry
    if name not in registry.names(kind):
        return None
    claims = registry.conflicts.get((kind, name))
    if claims:
        return " and ".join(d.origin for d in claims)
    return registry.get(kind, name).origin


def cmd_new_plugin(args: argparse.Namespace) -> int:
    owner = None if args.force else taken_by(args.kind, args.name)
    if owner is not None:
        raise RollartError(
            f"{args.kind} {args.name!r} is already registered by {owner}, installed here: "
            f"a second plugin with that name would make every config selecting it fail "
            f"(\"registered twice\"). Choose another name (`rollart plugins --kind "
            f"{args.kind}` lists the taken ones), or pass --force to write it anyway")
    root = write(args.kind, args.name, args.dir)
    dist = _names(args.kind, args.name)["dist"]
    print(f"wrote {root} (the package {dist})")
    print(f"next: pip install -e {root}  &&  pytest {root}  &&  rollart plugins --kind {args.kind}")
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("new-plugin", help="write a ready plugin package (pyproject, options, "
                       "README, a conformance test) into DIR",
                       description="Write a ready plugin package into DIR, the package folder "
                       "(created; default ./rollart-KIND-NAME): pyproject with the entry point, "
                       "an options model, a working backend, README and a test running the "
                       "kind's conformance kit.")
    p.add_argument("kind", choices=list(KIND_HOOK))
    p.add_argument("name", help="the name configs select, e.g. 'demo' (a-z, 0-9, _)")
    p.add_argument("dir", nargs="?", default=None, metavar="DIR",
                   help="the package folder to create (new or empty; default ./rollart-KIND-NAME)")
    p.add_argument("--force", action="store_true",
                   help="write it even if an installed plugin already registers NAME")
    p.set_defaults(func=cmd_new_plugin)
