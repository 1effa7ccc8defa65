"""Puts this folder on sys.path so the control tests share ``control_configs``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
