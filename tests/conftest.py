"""Make the helper modules in tests/ (controlplane, webhookproc) importable from every test.

pytest runs with --import-mode=importlib (several directories hold test modules with the same
basename), which does not put test directories on sys.path by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
# After the repository's root (pyproject's pythonpath): the test folders mirror the packages
# (tests/webhook/quota beside webhook/quota, tests/cli beside cli), and a folder found before the
# package of the same name would shadow it, as a namespace package or, with an __init__.py, as a package.
if str(TESTS_DIR) not in sys.path:
    sys.path.append(str(TESTS_DIR))
