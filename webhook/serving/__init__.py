"""HTTP serving: the gunicorn application, TLS and worker settings, the worker class, the WSGI app
with its admission routes and probes, connection balancing, supervision of the quota service, and
the server's metrics."""
