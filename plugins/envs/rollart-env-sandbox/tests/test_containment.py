"""Hostile actions are contained: each test is an attack, run for real in the sandbox.

Tool-call attacks go through the env's file tools; code attacks are written into the
repository and executed by ``run_tests`` (as the model would), jailed with small limits.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import pytest
from rollart_env_sandbox import SandboxCodeEnv, probe
from rollart_env_sandbox.sandbox import NOBODY

ISOLATION = probe()
pytestmark = pytest.mark.skipif(
    not (ISOLATION.netns and ISOLATION.landlock),
    reason=f"no sandbox isolation on this machine: {'; '.join(ISOLATION.problems)}",
)
SECRET = "top secret host data"


def call(tool: str, **args) -> str:
    return json.dumps({"tool": tool, **args})


@pytest.fixture
def env(open_dir):
    e = SandboxCodeEnv(base_dir=str(open_dir / "boxes"), task_ids=["add-utils"], cpu_s=3,
                       memory_mb=256, file_size_mb=1, max_procs=16, wall_timeout_s=8,
                       max_tool_calls=50)
    e.reset(seed=0)
    yield e
    e.close()


@pytest.fixture
def secret(open_dir) -> Path:
    """A host file the jailed user could read and write if nothing stopped it."""
    path = open_dir / "secret.txt"
    path.write_text(SECRET)
    os.chmod(path, 0o666)
    return path


def run_code(env: SandboxCodeEnv, code: str) -> tuple[str, dict]:
    """Put ``code`` in a test module and let run_tests execute it."""
    env.step(call("write_file", path="test_attack.py", content=code))
    obs, _, _, _, info = env.step(call("run_tests"))
    return obs, info


# ------------------------------------------------------------------ path escape (tools)
@pytest.mark.parametrize("tool", ["read_file", "write_file"])
def test_dotdot_escape_is_refused(env, secret, tool):
    rel = os.path.relpath(secret, env.sandbox.root)
    assert rel.startswith("..")
    obs, *_, info = env.step(call(tool, path=rel, content="overwritten"))
    assert obs.startswith("refused:") and info["refused"] and SECRET not in obs
    assert secret.read_text() == SECRET


@pytest.mark.parametrize("tool", ["read_file", "write_file"])
def test_absolute_path_is_refused(env, secret, tool):
    obs, *_ = env.step(call(tool, path=str(secret), content="overwritten"))
    assert obs.startswith("refused:") and "absolute" in obs and SECRET not in obs
    assert secret.read_text() == SECRET
    assert env.step(call("read_file", path="/etc/passwd"))[0].startswith("refused:")


def test_symlink_planted_by_code_cannot_be_followed_by_the_tools(env, secret):
    """The code makes links to a host file (itself allowed: a link is a file in its dir);
    the tools must not read or write through them."""
    out, _ = run_code(env, f"import os\nos.symlink({str(secret)!r}, 'link.txt')\n"
                           f"os.symlink({str(secret.parent)!r}, 'dirlink')\n")
    assert (env.sandbox.root / "link.txt").is_symlink()
    for path in ("link.txt", f"dirlink/{secret.name}"):
        obs, *_ = env.step(call("read_file", path=path))
        assert obs.startswith("refused:") and SECRET not in obs
        obs, *_ = env.step(call("write_file", path=path, content="overwritten"))
        assert obs.startswith("refused:")
    assert secret.read_text() == SECRET


def test_hard_link_to_a_host_file_is_impossible(env, secret):
    out, _ = run_code(env, f"import os\ntry:\n    os.link({str(secret)!r}, 'hard.txt')\n"
                           "    print('LINKED')\nexcept OSError as e:\n    print('DENIED', e)\n")
    assert "DENIED" in out and "LINKED" not in out


# ------------------------------------------------------------------ code attacks
def test_writing_outside_the_directory_fails(env, open_dir):
    outside = open_dir / "outside"
    outside.mkdir(mode=0o777)
    os.chmod(outside, 0o777)  # world-writable: file permissions alone would allow it
    target = outside / "pwned.txt"
    code = (f"import os\nfor p in [{str(target)!r}, '/tmp/rollart-pwned.txt', '../pwned.txt']:\n"
            "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n"
            "    except OSError as e:\n        print('DENIED', p, e.errno)\n")
    out, _ = run_code(env, code)
    assert "WROTE" not in out and out.count("DENIED") == 3
    assert not target.exists() and not Path("/tmp/rollart-pwned.txt").exists()
    assert not (env.sandbox.root.parent / "pwned.txt").exists()


def test_opening_a_socket_reaches_nothing(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept() -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept)
    t.start()
    code = ("import socket\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n        socket.create_connection(addr, timeout=2)\n        print('CONNECTED', addr)\n"
            "    except OSError as e:\n        print('DENIED', addr, e.errno)\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "try:\n    s.sendto(b'x', ('127.0.0.1', 9))\n    print('SENT')\nexcept OSError as e:\n"
            "    print('DENIED udp', e.errno)\n")
    out, _ = run_code(env, code)
    t.join()
    server.close()
    assert not accepted, "the sandbox connected to a host socket"
    assert "CONNECTED" not in out and "SENT" not in out and out.count("DENIED") == 3


def _nobody_processes() -> int:
    count = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == NOBODY:
                    count += 1
            except OSError:
                continue
    return count


def test_fork_bomb_is_capped_and_cleaned_up(env):
    before = _nobody_processes()
    code = ("import os, time\nn = 0\nfor _ in range(10000):\n    try:\n        if os.fork() == 0:\n"
            "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
            "    except OSError:\n        break\nprint('FORKED', n, flush=True)\ntime.sleep(60)\n")
    t0 = time.monotonic()
    out, info = run_code(env, code)
    assert time.monotonic() - t0 < 30
    forked = int(out.split("FORKED", 1)[1].split()[0])
    assert forked < 16, f"{forked} processes: RLIMIT_NPROC did not hold"
    assert info["run"] == "killed: wall-clock timeout"
    deadline = time.monotonic() + 10
    while _nobody_processes() > before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _nobody_processes() <= before, "sandbox processes survived the run"


def test_memory_hog_gets_memory_error(env):
    out, info = run_code(env, "x = bytearray(2 * 1024**3)\nprint('ALLOCATED')\n")
    assert "MemoryError" in out and "ALLOCATED" not in out


def test_infinite_loop_is_killed(env):
    t0 = time.monotonic()
    out, info = run_code(env, "while True:\n    pass\n")
    assert time.monotonic() - t0 < 20
    assert info["run"] in ("killed: wall-clock timeout", "killed by signal SIGXCPU",
                           "killed by signal SIGKILL")
    assert info["passed"] == 0


def test_huge_file_is_cut_at_the_size_limit(env):
    out, _ = run_code(env, "import os\nwith open('big.bin', 'wb') as f:\n"
                           "    for _ in range(64):\n        f.write(b'x' * 1024 * 1024)\n")
    # exactly the limit: the writes ran (not a jail that never started) and were cut there
    assert (env.sandbox.root / "big.bin").stat().st_size == 1024 * 1024
