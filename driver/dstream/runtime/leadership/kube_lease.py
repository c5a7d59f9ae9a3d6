"""Who leads a checkpoint on Kubernetes: a coordination.k8s.io/v1 Lease, one per job.

On pods the kernel lock of lease.py is no use: the two drivers of a job (`driver.standby`) run
in different pods, usually on different nodes, and share the checkpoint only through a volume.
So the election is a Lease on the API server instead. The driver that takes it (free, or its
holder's renewal unchanged for the Lease's duration) leads; the other follows the checkpoint
and polls the Lease. Every write carries the resourceVersion read, so two candidates cannot
both win one round.

The Lease only elects. The epoch still comes from the checkpoint (fencing.py: the next claim
after the newest), and every record and commit is checked against it there, so a leader that
lost its Lease while frozen or cut off from the API server cannot commit either: the claim of
its successor deposes it at its next write. The Lease's `leaseTransitions` counts the changes
of holder, for people reading `kubectl get lease`.

Expiry is timed on this machine's monotonic clock from the moment this candidate first saw the
holder's current renewal, as client-go does: the drivers' clocks must run at the same rate, not
agree. A holder that cannot renew for two thirds of the duration gives up the lead itself
(lease.LeadLostError, exit 6), before any candidate may take the Lease over.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from dstream.runtime.leadership.fencing import holder_name
from dstream.runtime.leadership.lease import KUBE_LEASE_KEY

log = logging.getLogger(__name__)

# A pod is `<name>/<uid>` in the Lease: the operator reads which pod leads, and a pod created
# again under the name of a dead leader is another candidate, not that leader.
POD_NAME_ENV, POD_UID_ENV = "POD_NAME", "POD_UID"
API_TIMEOUT_S = 2.0
RENEW_DEADLINE = 2 / 3  # of the duration: a holder unable to renew that long stops leading
_API_ERRORS = (ApiException, HTTPError, OSError)
MERGE_PATCH = "application/merge-patch+json"  # with metadata.resourceVersion: compare-and-set


@dataclass(frozen=True)
class LeaseView:
    """The part of a Lease the election reads."""

    holder: str | None
    renewed: str | None  # renewTime as written: only ever compared for a change
    duration_s: float
    transitions: int
    version: str


def view_of(lease: Any) -> LeaseView:
    """A V1Lease from the kubernetes client, condensed."""
    spec = lease.spec
    return LeaseView(
        holder=spec.holder_identity or None,
        renewed=str(spec.renew_time) if spec.renew_time else None,
        duration_s=float(spec.lease_duration_seconds or 0),
        transitions=int(spec.lease_transitions or 0),
        version=lease.metadata.resource_version,
    )


class ExpiryClock:
    """When the holder's renewal was first seen unchanged, on this machine's monotonic clock."""

    def __init__(self) -> None:
        self._seen: tuple[str | None, str | None, float] | None = None

    def free_for(self, lease: LeaseView, identity: str, now: float) -> bool:
        """Whether `identity` may take the Lease at monotonic time `now`: nobody holds it, it
        holds it already, or the holder has not renewed it for a whole duration."""
        if not lease.holder or lease.holder == identity:
            return True
        if self._seen is None or self._seen[:2] != (lease.holder, lease.renewed):
            self._seen = (lease.holder, lease.renewed, now)
        return now - self._seen[2] >= lease.duration_s


def micro_time(moment: datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLease:
    """The election of one job's drivers through its Lease; see the module docstring."""

    def __init__(self, api: Any, namespace: str, name: str, identity: str, duration_s: float):
        self.api = api  # a kubernetes.client.CoordinationV1Api
        self.namespace, self.name = namespace, name
        self.identity = identity
        self.duration_s = duration_s
        self.poll_s = min(1.0, duration_s / 10)  # a standby's reads of the Lease
        self._expiry = ExpiryClock()
        self._renewed_at = -math.inf  # monotonic time of this holder's last renewal

    def __str__(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def try_acquire(self) -> bool:
        """Take the Lease if it is free or expired; True when this driver holds it now."""
        try:
            lease = self._read()
            if lease is None:
                return self._create()
            if not self._expiry.free_for(lease, self.identity, time.monotonic()):
                return False
            transitions = lease.transitions + (lease.holder != self.identity)
            return self._write(lease, transitions, acquired=True)
        except _API_ERRORS as error:
            log.warning("cannot take %s yet: %s", self, _reason(error))
            return False

    def renew(self) -> str | None:
        """Renew the Lease; None while this driver holds it, else why it does not any more
        (another driver holds it, or it could not be renewed within the deadline)."""
        try:
            lease = self._read()
            if lease is not None and lease.holder not in (None, self.identity):
                return f"the Lease is held by {lease.holder}"
            if lease is not None and self._write(lease, lease.transitions, acquired=False):
                return None
        except _API_ERRORS as error:
            log.warning("cannot renew %s: %s", self, _reason(error))
        if time.monotonic() - self._renewed_at >= RENEW_DEADLINE * self.duration_s:
            return f"the Lease could not be renewed for {RENEW_DEADLINE * self.duration_s:.1f}s"
        return None

    def release(self) -> None:
        """Give the Lease up on a clean stop, so that the standby takes over at once."""
        try:
            lease = self._read()
            if lease is None or lease.holder != self.identity:
                return
            self._patch(lease, {"holderIdentity": None})
        except _API_ERRORS as error:  # it expires on its own
            log.warning("cannot release %s: %s", self, _reason(error))

    def describe(self) -> str:
        """Who holds the Lease, for the message of a driver kept out."""
        try:
            lease = self._read()
        except _API_ERRORS as error:
            return f"{self} unreadable: {_reason(error)}"
        return f"{self} held by {lease.holder if lease else 'nobody'}"

    def _read(self) -> LeaseView | None:
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return view_of(lease)

    def _spec(self, transitions: int, acquired: bool) -> dict[str, Any]:
        now = micro_time(datetime.now(UTC))
        spec = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, math.ceil(self.duration_s)),
            "renewTime": now,
            "leaseTransitions": transitions,
        }
        return spec | ({"acquireTime": now} if acquired else {})

    def _create(self) -> bool:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": self._spec(0, acquired=True),
        }
        try:
            self.api.create_namespaced_lease(self.namespace, body, _request_timeout=API_TIMEOUT_S)
        except ApiException as error:
            if error.status == 409:  # another candidate created it first
                return False
            raise
        self._renewed_at = time.monotonic()
        return True

    def _write(self, lease: LeaseView, transitions: int, acquired: bool) -> bool:
        """Write the Lease read as `lease`; False if another driver wrote it meanwhile."""
        try:
            self._patch(lease, self._spec(transitions, acquired))
        except ApiException as error:
            if error.status == 409:
                return False
            raise
        self._renewed_at = time.monotonic()
        return True

    def _patch(self, lease: LeaseView, spec: dict[str, Any]) -> None:
        """Patch the spec of the Lease read as `lease`, unless it changed since (HTTP 409)."""
        body = {"metadata": {"resourceVersion": lease.version}, "spec": spec}
        self.api.patch_namespaced_lease(
            self.name,
            self.namespace,
            body,
            _request_timeout=API_TIMEOUT_S,
            _content_type=MERGE_PATCH,
        )


def kube_lease(where: str, duration_s: float) -> KubeLease:
    """The Lease `<namespace>/<name>` (`spark.dstream.lease.kubernetes`, which the operator sets
    for jobs with a standby), with this pod as identity (`identity`), through the pod's ServiceAccount or else the kubeconfig."""
    namespace, sep, name = where.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{KUBE_LEASE_KEY} must be <namespace>/<name>, got {where!r}")
    from kubernetes import client, config

    if "KUBERNETES_SERVICE_HOST" in os.environ:
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return KubeLease(client.CoordinationV1Api(), namespace, name, identity(), duration_s)


def identity() -> str:
    """This driver in the Lease: `<pod name>/<pod uid>` in a pod, else `<host>:<pid>`."""
    pod, uid = os.environ.get(POD_NAME_ENV), os.environ.get(POD_UID_ENV)
    return f"{pod}/{uid}" if pod and uid else holder_name()


def _reason(error: BaseException) -> str:
    status = getattr(error, "status", None)
    return f"HTTP {status} {getattr(error, 'reason', '')}".strip() if status else repr(error)
