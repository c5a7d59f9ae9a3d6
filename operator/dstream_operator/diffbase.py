"""kopf's bookkeeping made cheap: its diff base (the last handled state of a job, to find what
changed) kept in memory, and its handlers' progress written only while a handler retries.

kopf's own storages write both into the object after every handled change: a PATCH per new job,
which the watch then sends back as one more event for kopf and the supervisor to process, and
a JSON annotation parsed again on every event of the job. With 200 jobs created at once those
were a request, an event and a supervision step per job (docs/operator-scale.md).

Kept in memory, an operator that starts (after a restart, or a new leader) knows no job's last
handled state: kopf then calls every job's creation handler, which the operator registers for
resuming too, and a spec changed while no operator ran is found the Kubernetes way instead, by
the status's observedGeneration lagging the job's generation (`handlers.set_up`).

kopf also builds the "essence" of every object on every watch event, pods included, and its own
build deep-copies the whole body first (status, managedFields and, for a pod, its whole spec)
to throw most of it away. Only StreamingJobs have handlers that look at changes; pods have
watching handlers only, which never read it.

A handler's progress (kopf's retry count, its start) is still kept in annotations, as kopf
does, but without kopf's "managed by" marker annotation: a handler that succeeds at once has its
progress purged in the same cycle, which then leaves nothing to write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import kopf

# The kinds with kopf changing handlers (handlers.py): only theirs is ever compared.
CHANGING_KINDS = frozenset({"StreamingJob"})
KEPT_METADATA = ("labels", "annotations")  # what kopf's essence keeps of the metadata


class MemoryDiffBaseStorage(kopf.DiffBaseStorage):
    """The last handled essence of each object, by uid, for this operator's lifetime."""

    def __init__(self) -> None:
        super().__init__()
        self._essences: dict[str, kopf.BodyEssence] = {}

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None
    ) -> kopf.BodyEssence:
        """kopf's essence, built from the fields it keeps instead of from a copy of the
        whole body; an empty one for kinds whose essence nothing reads."""
        if body.get("kind") not in CHANGING_KINDS:
            return kopf.BodyEssence()
        return super().build(body=kopf.Body(essential_fields(body)), extra_fields=extra_fields)

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return self._essences.get(uid_of(body))

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        self._essences[uid_of(body)] = essence

    def forget(self, uid: str) -> None:
        """The object is gone: nothing to compare it with any more."""
        self._essences.pop(uid, None)


def uid_of(body: kopf.Body) -> str:
    return (body.get("metadata") or {}).get("uid", "")


def essential_fields(body: kopf.Body) -> dict[str, Any]:
    """The top-level fields and the metadata kopf's essence is made of (a shallow view: kopf
    copies what it keeps). The status is left out: kopf drops it, and no handler is for a
    status field."""
    meta = body.get("metadata") or {}
    trimmed = {key: value for key, value in body.items() if key not in ("metadata", "status")}
    trimmed["metadata"] = {key: meta[key] for key in KEPT_METADATA if key in meta}
    return trimmed


class ProgressAnnotations(kopf.AnnotationsProgressStorage):
    """kopf's annotation progress storage, without the marker annotation it adds to every
    object it stores progress for (the marker tells other kopf operators which annotation
    prefix is kopf's; ours are all transient)."""

    def store(self, *, key: Any, record: Any, body: kopf.Body, patch: kopf.Patch) -> None:
        encoded = json.dumps(
            {k: v for k, v in record.items() if v is not None}, separators=(",", ":")
        )
        for full_key in self.make_keys(key, body=body):
            patch.metadata.annotations[full_key] = encoded
