"""Shared I/O for the webhook, the CLI and the tests: manifest files, cluster access, certificates."""
