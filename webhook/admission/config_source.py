"""The config file (conversion table and enforcement modes), re-read when it changes.

In a cluster the file is a ConfigMap volume: kubelet writes each version into a new timestamped
directory and swaps the ``..data`` symlink to it, so the path the server was given keeps its name
while the file behind it is replaced. :class:`ConfigSource` stats that path (following the
symlinks) at most once per ``interval`` seconds, on the request path of whichever thread comes
first, and re-reads it when the device, inode, size or modification time changed. New requests
then use the new table and modes; a request already running keeps the config it started with.

A new version that cannot be read or parsed is logged (once per version) and the previous config
stays in force: never a crash, never a silent fall back to the defaults.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from gpuquota_core.conversion import ConversionConfig
from kubeaccess.conversion_config import ConfigFileError, read_config_file
from kubeaccess.file_signature import FileSignature, file_signature

CHECK_INTERVAL_SECONDS = 1.0



class ConfigSource:
    """The config in force, re-read from ``path`` when it changes (``path=None``: fixed)."""

    def __init__(self, config: ConversionConfig, path: Path | None = None, *,
                 interval: float = CHECK_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic,
                 logger: logging.Logger | None = None) -> None:
        self._config = config
        self._path = path
        self._interval = interval
        self._clock = clock
        self._log = logger or logging.getLogger("gpuquota.webhook")
        self._lock = threading.Lock()
        self._next_check = float("-inf")
        # None: not compared yet. The first check re-reads the file, so a version written between
        # the master's startup read and this worker's first request is not missed.
        self._seen: FileSignature | None = None
        self._first = True

    @property
    def path(self) -> Path | None:
        return self._path

    def current(self) -> ConversionConfig:
        """The config for a new request; checks the file when the interval has passed."""
        if self._path is None or self._clock() < self._next_check:
            return self._config
        # One thread checks; the others go on with the config in force instead of waiting.
        if not self._lock.acquire(blocking=False):
            return self._config
        try:
            self._next_check = self._clock() + self._interval
            self._check(self._path)
        finally:
            self._lock.release()
        return self._config

    def _check(self, path: Path) -> None:
        # Imported here: the master reads the file (read_config_file) before the metrics directory is
        # set up, and the metrics must not be imported before that (see webhook.admission.observability).
        from webhook.admission.observability import CONFIG_RELOADS

        signature = file_signature(path)
        if signature is not None and signature == self._seen:
            return
        first, self._first = self._first, False
        try:
            config = read_config_file(path)  # a missing file says so in its error
        except ConfigFileError as error:
            if signature != self._seen or first:
                self._event("error", path, error=str(error), level=logging.ERROR)
                CONFIG_RELOADS.labels("error").inc()
            self._seen = signature
            return
        self._seen = signature
        if config == self._config:
            return  # touched, or the startup version: nothing to announce
        self._config = config
        CONFIG_RELOADS.labels("loaded").inc()
        self._event("loaded", path, enforcement=config.enforcement.describe())

    def _event(self, result: str, path: Path, *, level: int = logging.INFO, **fields: str) -> None:
        record = {"event": "config_reload", "result": result, "path": str(path), "pid": os.getpid(), **fields}
        if result == "error":
            record["kept"] = "the previous config stays in force"
        self._log.log(level, "%s", orjson.dumps(record).decode())
