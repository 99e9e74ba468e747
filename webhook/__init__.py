"""The admission webhook: HTTP, TLS and cluster state around the I/O-free core."""
