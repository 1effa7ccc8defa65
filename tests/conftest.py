"""Shared fixtures for the core's tests."""

from __future__ import annotations

import importlib
import os

import pytest


@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """A directory on sys.path (and PYTHONPATH for subprocesses) for fake distributions."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    importlib.invalidate_caches()
    return site
