"""The quota decider: the quota service process (``service``, started with ``options``), its wire
protocol (``wire``, ``loop``) and the client the workers use (``client``); the quota state it keeps
from manifests or a list/watch of the cluster (``state``, ``cluster_state``, ``pod_versions``), with
local accounting's reservations; strict accounting's shared ledger (``strict``); the node view it
publishes to the workers (``node_view``); Events (``events``, ``event_recorder``) and its metrics.

It imports the core and kubeaccess only, never the admission or serving packages."""
