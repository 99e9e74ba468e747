"""Whether a file changed since it was last read, without reading it.

Mounted Secrets and ConfigMaps change by swapping the ``..data`` symlink (the path then resolves to
a new inode); a file rewritten in place changes its mtime or size. The serving certificate, the
conversion config and the workers' node view are re-read only when this signature differs from the
last one seen. It lives in kubeaccess, below every webhook package that reads files (admission, quota, serving).
"""

from __future__ import annotations

import os
from pathlib import Path

FileSignature = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns


def signature_of(stat: os.stat_result) -> FileSignature:
    """The signature of a file already stat'ed (``os.stat`` of a path or ``os.fstat`` of an open file)."""
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


def file_signature(path: str | Path) -> FileSignature | None:
    """The signature of the file ``path`` resolves to now, or None when it cannot be read."""
    try:
        stat = Path(path).stat()  # follows symlinks: a swapped ..data shows as a new inode
    except OSError:
        return None
    return signature_of(stat)
