"""The conversion config file (conversion table and enforcement modes): one reader for the CLI and the server.

``gpuquota serve`` reads it at start (a bad file stops it before serving) and its workers re-read it
when it changes (webhook.admission.config_source); ``gpuquota convert``, ``audit`` and the other
commands read it once. All of them through :func:`load_conversion_config`, so a file one accepts,
the others accept, with the same one-line error otherwise.
"""

from __future__ import annotations

from pathlib import Path

from gpuquota_core.conversion import DEFAULT_CONFIG, ConfigError, ConversionConfig, load_config


class ConfigFileError(ValueError):
    """A config file that cannot be used; the message is one line and names the file."""


def read_config_file(path: Path) -> ConversionConfig:
    # The manifests' reader: one-line errors with line and column, alias bombs refused.
    from kubeaccess.manifests import ManifestError, load_yaml_documents, not_text

    try:
        documents = load_yaml_documents(path.read_text(encoding="utf-8"), str(path))
    except OSError as error:
        raise ConfigFileError(f"{path}: cannot read the conversion config: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigFileError(f"{path}: {not_text(error)}") from None
    except ManifestError as error:
        raise ConfigFileError(str(error)) from None
    document = next((d for d in documents if d is not None), None)
    try:
        return load_config(document)
    except ConfigError as error:
        raise ConfigFileError(f"{path}: {error}") from None


def load_conversion_config(path: Path | None) -> ConversionConfig:
    """The config in ``path``, or the built-in defaults without one; raises ConfigFileError."""
    return DEFAULT_CONFIG if path is None else read_config_file(path)
