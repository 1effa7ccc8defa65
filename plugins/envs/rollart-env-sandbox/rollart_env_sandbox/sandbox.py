"""A private, limited, network-less place to run untrusted code, and safe file access to it.

One :class:`Sandbox` per episode: a fresh directory under ``base_dir``; commands run in
it through :func:`jail_command` (user + network + PID namespaces, rlimits, Landlock; see
:mod:`rollart_env_sandbox.jail`), with a wall-clock timeout after which the whole process
tree is killed (the PID namespace dies with its first process). The host side reads and
writes files only through :meth:`Sandbox.read` / :meth:`Sandbox.write`, which refuse
absolute paths, ``..``, symlinks and hard links that lead outside the directory.

:func:`probe` finds out once per process what the kernel allows; :class:`Sandbox` refuses
to start without a network namespace and Landlock unless the caller explicitly allows it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rollart_env_sandbox.jail import landlock_abi

NOBODY = 65534
# The jail runs as a script (stdlib only) so that nothing of this package is imported there.
_JAIL = str(Path(__file__).resolve().with_name("jail.py"))
_PREFIX = "rollart-sandbox-"


class SandboxUnavailable(RuntimeError):
    """The isolation the options require is not available on this machine."""


class PathRefused(ValueError):
    """A file path that would leave the sandbox directory (or is otherwise not allowed)."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    memory_mb: int = 512
    file_size_mb: int = 8
    max_procs: int = 32
    wall_timeout_s: float = 15.0
    max_output_chars: int = 4000


@dataclass(frozen=True)
class Isolation:
    """What this machine allows: how commands are wrapped, and what was refused and why."""

    prefix: tuple[str, ...]  # argv put in front of the jail (setpriv / unshare)
    python: str  # interpreter the jailed user can run (jail script and test runs)
    jail: str  # path of the jail script, readable by the jailed user
    netns: bool
    landlock: int  # Landlock ABI in use, 0: none
    drop_to_nobody: bool
    problems: tuple[str, ...] = ()

    def describe(self) -> str:
        net = "network+PID namespaces" if self.netns else "NO network isolation"
        fs = f"Landlock ABI {self.landlock}" if self.landlock else "NO write confinement"
        who = "uid nobody" if self.drop_to_nobody else f"uid {os.geteuid()}"
        return f"{net}, {fs}, {who}, {self.python}"


def default_base() -> Path:
    return Path(tempfile.gettempdir()) / "rollart-sandboxes"


def _prepare_base(base: Path) -> str:
    """Create ``base`` (others may traverse, not list) and put a copy of the jail script
    there: the jailed user may not be able to read this package's own directory."""
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o711)
    text = Path(_JAIL).read_bytes()
    jail = base / f"jail-{hashlib.sha256(text).hexdigest()[:12]}.py"
    if not jail.exists():
        tmp = base / f".jail-{os.getpid()}.tmp"
        tmp.write_bytes(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, jail)
    return str(jail)


@functools.lru_cache(maxsize=8)
def probe(base_dir: str | None = None) -> Isolation:
    """Try the wrappers and interpreters on this machine (once per process and base
    directory) and keep the first combination that runs a jailed ``pass``."""
    base = Path(base_dir) if base_dir else default_base()
    jail = _prepare_base(base)
    root = os.geteuid() == 0
    drop = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--")
    ns = ("unshare", "--user", "--net", "--pid", "--fork", "--kill-child", "--")
    candidates: list[tuple[str, ...]] = [(*drop, *ns)] if root else [ns]
    if root:
        # Some kernels forbid unprivileged user namespaces: root can still make the
        # network and PID namespaces, then drop to nobody inside them.
        candidates.append(("unshare", "--net", "--pid", "--fork", "--kill-child", "--", *drop))
    # The jailed user must be able to run the interpreter (a venv under /root may not be).
    pythons = list(dict.fromkeys(
        p for p in (sys.executable, shutil.which("python3"), "/usr/bin/python3",
                    "/usr/local/bin/python3") if p and os.path.exists(p)))
    problems = []
    abi = landlock_abi()
    for prefix in candidates:
        if shutil.which(prefix[0]) is None:
            problems.append(f"{prefix[0]} is not installed")
            continue
        for python in pythons:
            argv = [*prefix, python, "-I", jail, "--dir", "/", "--cpu", "10", "--mem",
                    str(1 << 30), "--fsize", "1024", "--nproc", "64", "--", python, "-I", "-c",
                    "pass"]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as exc:
                problems.append(f"{' '.join(prefix[:3])}... {python}: {exc}")
                continue
            if done.returncode == 0:
                return Isolation(tuple(prefix), python, jail, True, abi, root, tuple(problems))
            problems.append(f"{' '.join(prefix)} {python}: {done.stderr.strip()[-160:]}")
    closed = [str(p) for p in (base, *base.parents) if root and not os.stat(p).st_mode & 0o001]
    if closed:
        problems.append(f"the jailed user (nobody) cannot traverse {', '.join(closed)}: choose a "
                        "base_dir whose parents are all world-traversable (chmod o+x)")
    if not abi:
        problems.append("the kernel has no Landlock (writes outside the directory are not confined)")
    return Isolation(drop if root else (), sys.executable, jail, False, abi, root, tuple(problems))


@dataclass
class RunResult:
    returncode: int | None
    output: str
    timed_out: bool
    seconds: float

    def summary(self) -> str:
        if self.timed_out:
            return "killed: wall-clock timeout"
        rc = self.returncode
        if rc is not None and rc < 0:
            return f"killed by signal {signal.Signals(-rc).name}"
        if rc is not None and 128 < rc < 128 + signal.NSIG:  # the jail's report of a signal
            try:
                return f"killed by signal {signal.Signals(rc - 128).name}"
            except ValueError:
                pass  # not a signal number this platform names: report the exit code
        return f"exit code {rc}"


def sweep_stale(base: Path) -> int:
    """Remove sandbox directories left by processes that no longer exist."""
    removed = 0
    for d in base.glob(f"{_PREFIX}*"):
        try:
            pid = int(d.name[len(_PREFIX):].split("-", 1)[0])
        except ValueError:
            continue
        if d.is_dir() and pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed += 1
    return removed


class Sandbox:
    """A fresh directory for one episode; ``close()`` removes it (also on garbage collection)."""

    def __init__(self, base_dir: str | os.PathLike[str] | None, limits: Limits,
                 isolation: Isolation) -> None:
        self.limits = limits
        self.isolation = isolation
        base = Path(base_dir) if base_dir else default_base()
        base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)).resolve()
        self._closed = False

    # -------------------------------------------------------------- files (host side)
    def resolve(self, rel: str) -> Path:
        """The path of ``rel`` inside the sandbox, or PathRefused."""
        if not isinstance(rel, str) or not rel.strip() or "\x00" in rel:
            raise PathRefused("give a non-empty relative path, e.g. 'calc.py'")
        if os.path.isabs(rel) or rel.startswith("~"):
            raise PathRefused(f"{rel!r} is absolute; paths are relative to the repository root")
        target = (self.root / rel).resolve()  # follows symlinks: a link out ends outside
        if target != self.root and self.root not in target.parents:
            raise PathRefused(f"{rel!r} leads outside the repository")
        return target

    def read(self, rel: str, limit: int = 20_000) -> str:
        path = self.resolve(rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise PathRefused(f"{rel!r} does not exist") from None
        except OSError as exc:
            raise PathRefused(f"{rel!r} cannot be read: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise PathRefused(f"{rel!r} is not a regular file")
            if st.st_nlink > 1:
                raise PathRefused(f"{rel!r} is a hard link; refused")
            data = fh.read(limit + 1)
        text = data[:limit].decode("utf-8", errors="replace")
        return text + ("\n[... truncated]" if len(data) > limit else "")

    def write(self, rel: str, content: str, limit: int = 64_000) -> int:
        if len(content) > limit:
            raise PathRefused(f"content of {len(content)} characters is over the {limit} limit")
        path = self.resolve(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.resolve(str(path.parent.relative_to(self.root)) or ".")  # no link in between
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            raise PathRefused(f"{rel!r} cannot be written: {exc.strerror}") from None
        with os.fdopen(fd, "wb") as fh:
            if os.fstat(fh.fileno()).st_nlink > 1:
                raise PathRefused(f"{rel!r} is a hard link; refused")
            fh.write(content.encode())
        return len(content)

    def files(self) -> list[str]:
        out = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__pycache__")))
            for f in sorted(filenames):
                out.append(str(Path(dirpath, f).relative_to(self.root)))
        return out

    # -------------------------------------------------------------- running code
    def _hand_over(self) -> None:
        """As root, give the tree to nobody so the jailed command can write in it."""
        if not self.isolation.drop_to_nobody:
            return
        os.chown(self.root, NOBODY, NOBODY)
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), NOBODY, NOBODY)

    def run(self, argv: list[str]) -> RunResult:
        """Run ``argv`` jailed in the directory; never longer than the wall timeout."""
        if self._closed:
            raise RuntimeError("the sandbox is closed")
        lim = self.limits
        self._hand_over()
        # -I: no PYTHON* variables, no user site, no script dir on sys.path.
        jail = [self.isolation.python, "-I", self.isolation.jail, "--dir", str(self.root),
                "--cpu", str(lim.cpu_s), "--mem", str(lim.memory_mb << 20),
                "--fsize", str(lim.file_size_mb << 20), "--nproc", str(lim.max_procs),
                "--landlock", str(self.isolation.landlock), "--"]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as out:  # outside the sandbox; size bounded by RLIMIT_FSIZE
            proc = subprocess.Popen([*self.isolation.prefix, *jail, *argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, cwd=self.root, env=env,
                                    start_new_session=True)
            timed_out = False
            try:
                proc.wait(timeout=lim.wall_timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
            out.seek(0)
            raw = out.read(lim.max_output_chars + 1)
        text = raw[: lim.max_output_chars].decode("utf-8", errors="replace")
        if len(raw) > lim.max_output_chars:
            text += "\n[... output truncated]"
        return RunResult(None if timed_out else proc.returncode, text, timed_out,
                         time.monotonic() - t0)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            shutil.rmtree(self.root, ignore_errors=True)

    def __del__(self) -> None:  # a dropped env must not leave its directory behind
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: modules may be gone
            pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group (unshare and the namespace's first process:
    when that one dies the kernel kills everything else in the PID namespace)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    except PermissionError:
        proc.kill()
    proc.wait(timeout=10)
