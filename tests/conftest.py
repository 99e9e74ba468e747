"""Make the helper modules in tests/ (controlplane, webhookproc) importable from every test.

pytest runs with --import-mode=importlib (several directories hold test modules with the same
basename), which does not put test directories on sys.path by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))
