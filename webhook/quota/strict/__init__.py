"""Strict accounting: every admission recorded in a ledger ConfigMap per quota tree, shared by all
replicas, before it is answered (docs/accounting.md "Several replicas", docs/design.md).

One concept per module: ``store`` reads and writes the ledger objects (and holds a tree whose object
was lost), ``judgement`` judges admissions against the ledger as stored, ``escrow`` holds the rules
of room taken ahead for pods of one shape, and ``accounting`` (:class:`StrictAccounting`) runs the
group commit that ties them together: read and check the hold, judge, take escrow, write, answer.
With a writer Lease, ``writer_lease`` elects the one replica that writes, and ``forwarding`` sends
the others' admissions to it (or decides them here when it cannot be asked).
"""
