"""Every gpuquota command imports every command module; the heavy ones load only when used.

The kubernetes client, the server (gunicorn, Flask) and cryptography were most of a command's
start-up (0.75 s of CPU); an offline audit or plan of files needs none of them.
"""

from __future__ import annotations

import subprocess
import sys

from cli.audit import DEFAULT_CHUNK_SIZE
from kubeaccess.kube import DEFAULT_PAGE_SIZE


def test_the_audit_chunk_size_default_is_the_page_size_of_kubeaccess() -> None:
    assert DEFAULT_CHUNK_SIZE == DEFAULT_PAGE_SIZE


def test_importing_the_commands_loads_no_heavy_module() -> None:
    probe = ("import sys, cli.main; "
             "print(sorted(m for m in ('kubernetes', 'webhook.serving.server', 'gunicorn', 'flask', 'cryptography') "
             "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
