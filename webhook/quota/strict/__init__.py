"""Strict accounting: every admission recorded in a ledger ConfigMap per quota tree before it is
answered, by one writer (the writer Lease's holder) while it can be asked, and by the replica itself
in a named degraded mode when it cannot. One concept per module; docs/design.md, "Strict
accounting", draws the shape and ``accounting`` says where each piece lives.
"""
