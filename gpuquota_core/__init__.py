"""The I/O-free domain core of koord-gpuquota: every rule the webhook and the CLI apply lives here.

No module in this package reads files, opens sockets or talks to a cluster; they take plain
Kubernetes objects (dicts, as decoded from JSON/YAML) and return values.
"""
