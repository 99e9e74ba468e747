"""The validating webhook's verdict on one ElasticQuota object, as the webhook and the audit reach it.

``QuotaState.review_elasticquota`` (the webhook's quota service) and ``gpuquota audit`` both call
:func:`review_quota_object`, so an audit finding ``quota-refused-by-webhook`` carries exactly the
message the webhook answers a CREATE or UPDATE of that object with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .quantity import Quantity
from .quota_integrity import placement_problems
from .quota_objects import quota_from_object
from .quota_review import QuotaReview, review_quota
from .quota_tree import QuotaTree

# Written by ``gpuquota migrate apply`` (gpuquota_core.migration): a quota between two steps, the
# one state in which it may name both GPU families.
MIGRATION_IN_PROGRESS_ANNOTATION = "gpuquota.koord-gpuquota.io/migration"
IN_PROGRESS = "in-progress"


def migration_in_progress(obj: Mapping[str, Any]) -> bool:
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return isinstance(annotations, Mapping) and annotations.get(MIGRATION_IN_PROGRESS_ANNOTATION) == IN_PROGRESS


def review_quota_object(obj: Mapping[str, Any], tree: QuotaTree, used: Mapping[str, Quantity]) -> QuotaReview:
    """The review of ``obj`` stored among ``tree``'s quotas, with ``used`` its current usage: its
    own values (:func:`review_quota`), then its place in the tree (a taken name, a missing parent,
    a parent cycle: :func:`placement_problems`).

    Raises :class:`~gpuquota_core.quota_objects.QuotaShapeError` for an object that cannot be read (the
    webhook denies it as ``Invalid``, the audit reports ``quota-invalid``).
    """
    quota = quota_from_object(obj)
    review = review_quota(quota, tree, used, migrating=migration_in_progress(obj))
    placement = placement_problems(quota, tree.get)
    if not placement:
        return review
    return QuotaReview(review.problems + tuple(placement), review.warnings)
