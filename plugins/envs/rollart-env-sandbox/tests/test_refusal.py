"""Without a network namespace or Landlock the env refuses to start unless allowed."""

from __future__ import annotations

import pytest
import rollart_env_sandbox.env as env_mod
from rollart_env_sandbox import SandboxCodeEnv, SandboxUnavailable
from rollart_env_sandbox.sandbox import Isolation


def test_refuses_to_start_without_isolation(monkeypatch):
    weak = Isolation((), "python3", "jail.py", False, 0, False, ("unshare: not permitted",))
    monkeypatch.setattr(env_mod, "probe", lambda base=None: weak)
    with pytest.raises(SandboxUnavailable, match="network namespace.*Landlock.*not permitted"):
        SandboxCodeEnv()
    SandboxCodeEnv(allow_network=True, allow_unconfined_writes=True).close()
