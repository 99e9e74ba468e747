"""HTTP serving: the gunicorn application, TLS and worker settings, the worker class, connection
balancing, supervision of the quota service, and metrics."""
