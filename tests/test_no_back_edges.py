"""No back-edge on one trajectory's data path (issue 32; docs/architecture.md, "No
back-edge"): a part is given what it reports to in its constructor, by the composition
root, and never wired after it is built. Checked on the source (``ast``) of the core and
the first-party plugins:

1. no assignment to another object's hook attribute (``job.pipeline.on_step = ...``,
   ``pipeline.recovery.rebind = ...``, ``buffer.on_side_error = ...``);
2. no append to another object's listener list (``scheduler.on_finish.append(...)``,
   ``buffer.on_room.append(...)``), except the one named in ``ALLOWED_LISTS``;
3. the lower parts (the buffer, the events, the weight updates, the recovery) take no
   callable in their constructors beyond the ones named in ``ALLOWED_CALLABLES`` (a
   callback into an owner, like ``wake=scheduler.wake``, fails) and import neither the
   scheduler nor the pipeline;
4. no ``lambda`` is passed to the control plane's constructors (a lambda over an owner,
   like ``release=lambda v: self.trainers[0]...``).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOK_NAMES = {"rebind", "say", "evaluator"}  # besides every ``on_*`` attribute
# (file relative to the root, the list): each appends its own bound method in its own
# constructor; the proxy tells them an engine died (beside the trajectory's path).
ALLOWED_LISTS = {
    ("rollart_sdk/control/recovery.py", "on_worker_death"),
    ("rollart_sdk/control/weight_updates.py", "on_worker_death"),
}
LOWER = {
    "rollart_sdk/control/buffer.py": set(),
    "rollart_sdk/control/events.py": {"on_finish", "on_drop"},  # the readers, fixed at build
    # ``emit``: the run directory's event log (events.jsonl), written, never read back.
    "rollart_sdk/control/weight_updates.py": {"emit"},
    # ``rebind``: the composition root's re-binding of a restarted worker (its record);
    # ``say``: a line for the user's console (a death, a return), written, never read back.
    "rollart_sdk/control/recovery.py": {"emit", "rebind", "say"},
}
ALLOWED_CALLABLES = LOWER
UPPER_MODULES = ("rollart_sdk.control.scheduler", "rollart_sdk.control.pipeline")
CONSTRUCTORS = {"SampleBuffer", "RolloutEvents", "RolloutScheduler", "WeightUpdates",
                "EngineRecovery", "Pipeline"}


def sources() -> list[Path]:
    files = sorted((ROOT / "rollart_sdk").rglob("*.py"))
    files += [p for p in sorted((ROOT / "plugins").rglob("*.py"))
              if "tests" not in p.relative_to(ROOT).parts]
    return files


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _is_hook(attr: str) -> bool:
    return attr.startswith("on_") or attr in HOOK_NAMES


def late_wiring(tree: ast.AST, rel: str) -> list[str]:
    """Rules 1, 2 and 4 in one module: ``line: what`` for each finding."""
    found = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and _is_hook(t.attr) and not _is_self(t.value):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(t)} assigned after it was built")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            lst = node.func.value
            if (node.func.attr in ("append", "extend", "insert")
                    and isinstance(lst, ast.Attribute) and _is_hook(lst.attr)
                    and (rel, lst.attr) not in ALLOWED_LISTS):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...) appends "
                             "to another part's listener list")
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else (
                node.func.id if isinstance(node.func, ast.Name) else "")
            if name in CONSTRUCTORS:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    if any(isinstance(n, ast.Lambda) for n in ast.walk(arg)):
                        found.append(f"{rel}:{node.lineno}: a lambda passed to {name}(...)")
    return found


def callable_parameters(tree: ast.AST) -> dict[str, set[str]]:
    """Rule 3: per class, its ``__init__``'s parameters annotated with a ``Callable``."""
    out: dict[str, set[str]] = {}
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                args = [*fn.args.args, *fn.args.kwonlyargs]
                out[cls.name] = {a.arg for a in args if a.annotation is not None
                                 and ("Callable" in ast.unparse(a.annotation)
                                      or "Reader" in ast.unparse(a.annotation))}
    return out


def upward_imports(tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in UPPER_MODULES:
            out.append(node.module)
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name in UPPER_MODULES]
    return out


def test_no_part_is_wired_after_it_is_built():
    found = []
    for path in sources():
        rel = str(path.relative_to(ROOT))
        found += late_wiring(ast.parse(path.read_text(), rel), rel)
    assert not found, ("back-edges (docs/architecture.md, 'No back-edge'): give it to the "
                       "constructor instead, from the composition root (job/wire.py):\n"
                       + "\n".join(found))


def test_the_lower_parts_take_no_callback_into_an_owner_and_import_nothing_above():
    for rel, allowed in ALLOWED_CALLABLES.items():
        tree = ast.parse((ROOT / rel).read_text(), rel)
        for cls, params in callable_parameters(tree).items():
            extra = params - allowed
            assert not extra, (f"{rel}: {cls}.__init__ takes callables {sorted(extra)}: pass a "
                               "typed collaborator or write into RolloutEvents instead")
        assert not upward_imports(tree), f"{rel} imports {upward_imports(tree)}"


def test_the_rules_find_each_back_edge_that_was_removed():
    """The checks are not vacuous: each of the old wirings is found."""
    old = """
pipeline.recovery.rebind = rebind
job.pipeline.on_step = on_step
buffer.on_side_error = scheduler.side_error
scheduler.on_finish.append(self.watchdog.record)
buffer.on_room.append(self._wakeup.set)
WeightUpdates(sync, proxy, versions, release=lambda v: self.trainers[0].trainer.release_weights(v))
EngineRecovery(proxy, lock, engine_version=lambda: self.engine_version)
"""
    assert len(late_wiring(ast.parse(old), "x.py")) == 7
    wake = "class WeightUpdates:\n    def __init__(self, wake: Callable[[], None]) -> None: ..."
    assert callable_parameters(ast.parse(wake)) == {"WeightUpdates": {"wake"}}
    assert upward_imports(ast.parse("from rollart_sdk.control.scheduler import X"))
