"""The inside of a sandbox: apply limits to this process, then run the command.

Run by :mod:`rollart_env_sandbox.sandbox` as the innermost step of::

    [setpriv --reuid nobody]  unshare --user --net --pid --fork --kill-child \\
        python -I -m rollart_env_sandbox.jail --dir D --cpu S --mem B --fsize B --nproc N -- CMD...

(as root the uid is dropped first, so the namespaces belong to an unprivileged user).
Here, before ``exec``: rlimits (CPU seconds, address space, file size, processes, no core
files), then Landlock, which confines every write (create, remove, rename, link,
truncate) to ``D`` and, on ABI >= 4, denies TCP bind/connect. Reads are not restricted:
the command must read the Python it runs. Limits are inherited by every child, and an
unprivileged process cannot raise them again.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import sys

# Landlock (include/uapi/linux/landlock.h); syscall numbers are the same on every arch.
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38
FS_WRITE_FILE = 1 << 1
# Every right that changes the file system, by the ABI that introduced it.
FS_WRITE_RIGHTS = {
    1: (1 << 1) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 9) | (1 << 10)
    | (1 << 11) | (1 << 12),  # write file, remove dir/file, make char/dir/reg/sock/fifo/block/sym
    2: 1 << 13,  # refer: link or rename across directories
    3: 1 << 14,  # truncate
}
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_TCP = (1 << 0) | (1 << 1)  # ABI 4: bind, connect
SCOPE_ALL = (1 << 0) | (1 << 1)  # ABI 6: abstract unix sockets, signals outside the domain


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    try:
        abi = _libc().syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                              ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(0, int(abi))


def confine_writes(root: str, abi: int) -> None:
    """Landlock this process (and its future children): writes only beneath ``root``."""
    libc = _libc()
    fs = 0
    for version, rights in FS_WRITE_RIGHTS.items():
        if abi >= version:
            fs |= rights
    if abi >= 5:
        fs |= FS_IOCTL_DEV
    attr = _RulesetAttr(fs, NET_TCP if abi >= 4 else 0, SCOPE_ALL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, rights in ((root, fs), ("/dev/null", FS_WRITE_FILE)):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = _PathBeneath(rights, fd)
                if libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(SYS_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)


def apply_limits(cpu_s: int, mem_bytes: int, fsize_bytes: int, nproc: int) -> None:
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)),  # SIGXCPU at the soft limit, SIGKILL after
        (resource.RLIMIT_AS, (mem_bytes, mem_bytes)),
        (resource.RLIMIT_FSIZE, (fsize_bytes, fsize_bytes)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_NOFILE, (256, 256)),
    ):
        resource.setrlimit(limit, value)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rollart_env_sandbox.jail")
    p.add_argument("--dir", required=True)
    p.add_argument("--cpu", type=int, required=True)
    p.add_argument("--mem", type=int, required=True)
    p.add_argument("--fsize", type=int, required=True)
    p.add_argument("--nproc", type=int, required=True)
    p.add_argument("--landlock", type=int, default=0, help="Landlock ABI to use; 0: none")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    os.chdir(args.dir)
    if args.landlock:
        confine_writes(os.path.realpath(args.dir), args.landlock)
    apply_limits(args.cpu, args.mem, args.fsize, args.nproc)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": args.dir, "TMPDIR": args.dir,
           "LANG": "C.UTF-8", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    sys.stdout.flush()
    # Fork rather than exec: the command's death by a signal (SIGXCPU at the CPU limit,
    # SIGKILL) becomes exit status 128 + signal here. util-linux's `unshare --fork` cannot
    # re-raise every signal ("sigprocmask unblock failed") and would report exit 1 instead.
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(command[0], command, env)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
