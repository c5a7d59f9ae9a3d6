"""kopf's diff-base storage, made cheap per watch event.

kopf builds the "essence" of every object on every watch event, pods included, to find what
changed since the last handled state. Its own build deep-copies the whole body first (status,
managedFields and, for a pod, its whole spec) and then throws most of it away; with 200 jobs
created at once that was about a twentieth of the operator's CPU (docs/operator-scale.md). Only
StreamingJobs have handlers that look at changes (create, update, delete); pods have watching
handlers only, which never read the essence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import kopf

# The kinds with kopf changing handlers (handlers.py): only theirs is ever compared.
CHANGING_KINDS = frozenset({"StreamingJob"})
KEPT_METADATA = ("labels", "annotations")  # what kopf's essence keeps of the metadata


class JobDiffBaseStorage(kopf.AnnotationsDiffBaseStorage):
    """kopf's annotation storage (same key, same JSON, so what an earlier operator stored
    still reads), building the essence from the fields it keeps instead of from a copy of the
    whole body, and an empty one for kinds whose essence nothing reads."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        if body.get("kind") not in CHANGING_KINDS:
            return kopf.BodyEssence()
        return super().build(body=kopf.Body(essential_fields(body)), extra_fields=extra_fields)


def essential_fields(body: kopf.Body) -> dict[str, Any]:
    """The top-level fields and the metadata kopf's essence is made of (a shallow view: kopf
    copies what it keeps). The status is left out: kopf drops it, and no handler is for a
    status field."""
    meta = body.get("metadata") or {}
    trimmed = {key: value for key, value in body.items() if key not in ("metadata", "status")}
    trimmed["metadata"] = {key: meta[key] for key in KEPT_METADATA if key in meta}
    return trimmed
