"""The body of an admission review: how large it may be.

The largest review the API server sends is an UPDATE: it carries object and oldObject, each up
to etcd's 1.5 MiB limit on a stored object (protobuf), and their JSON runs about twice the
protobuf: 2 objects x 2 x 1.5 MiB = 6 MiB. The envelope (uid, kinds, userInfo, options) is a few
KiB; the other 2 MiB are for objects whose JSON is more than twice their protobuf. A larger body
can only be an attack or a mistake; a smaller cap would refuse a large pod's label change, which
a fail-closed validating webhook turns into a refused update.
"""

from __future__ import annotations

MAX_BODY_BYTES = 8 * 1024 * 1024
