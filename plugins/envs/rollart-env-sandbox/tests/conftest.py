"""A directory the jailed user (nobody, when the tests run as root) can reach."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest


@pytest.fixture
def open_dir():
    """Under the system temp dir (pytest's own tmp_path sits below a 0700 directory)."""
    d = Path(tempfile.mkdtemp(prefix="rollart-sbtest-", dir=tempfile.gettempdir()))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
