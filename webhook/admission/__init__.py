"""Admission: what the webhook decides for a review, knowing nothing of ours but the core.

One concept a file: the decisions (``decisions.py``), reading a review's body (``body.py``), the
AdmissionReview codec (``review.py``), what a decision leaves for operators (``observability.py``:
metrics and the decision log line), the config file in force (``config_source.py``), and the
ports through which the decisions reach what lies outside (``quota_port.py``: the quota decider,
the event reporter). HTTP, processes and their wiring are webhook.serving's."""
