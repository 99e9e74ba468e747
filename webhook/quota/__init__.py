"""The quota decider: the quota service process and its wire protocol, its state and cluster sync,
the strict ledger, the shared-memory totals, the client the workers use, and Events."""
