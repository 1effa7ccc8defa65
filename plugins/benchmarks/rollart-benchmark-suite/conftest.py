"""Lets pytest import this package from its folder before it is pip-installed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
