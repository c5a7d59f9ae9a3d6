"""One active operator among replicas, through a coordination.k8s.io/v1 Lease.

Why not kopf's peering: replicas at the same priority pause each other (all of them, the first
included), a killed operator's peering entry blocks its successors until the entry expires, and
pausing stops kopf's watches but not our supervisor. A Lease, as client-go's leader election
uses it, gives what is needed and can be shown on a real API server:

- a candidate takes the Lease only when it is free or its holder has not renewed it for
  `lease_seconds` (every write carries the resourceVersion read, so two candidates cannot both
  win the same round);
- the holder renews every `renew_seconds`; if it cannot renew for `deadline_seconds` (shorter
  than `lease_seconds`) it stops acting, before any other candidate may take over;
- a holder that stops cleanly releases the Lease, so its successor need not wait for it to
  expire.

Like client-go's, this assumes that the replicas' clocks run at the same rate (not that they
agree) and that a process is not paused for longer than `lease_seconds - deadline_seconds`; the
operator's writes are level-triggered and idempotent, so a short overlap would cost duplicate
API calls, not a second driver (creating the driver pod claims its fixed name).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dstream_operator import metrics
from dstream_operator.kube import Kube, KubeError

logger = logging.getLogger(__name__)

API_VERSION = "coordination.k8s.io/v1"


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 15.0
    renew_seconds: float = 5.0
    deadline_seconds: float = 10.0
    retry_seconds: float = 2.0


def micro_time(moment: datetime) -> str:
    """Kubernetes' MicroTime: RFC 3339 with microseconds, in UTC."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_body(settings: LeaseSettings, now: datetime, acquired: datetime) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "Lease",
        "metadata": {"name": settings.name, "namespace": settings.namespace},
        "spec": {
            "holderIdentity": settings.identity,
            "leaseDurationSeconds": round(settings.lease_seconds),
            "acquireTime": micro_time(acquired),
            "renewTime": micro_time(now),
        },
    }


def free_for(lease: dict[str, Any], identity: str, seen_renewal_at: float, now: float) -> bool:
    """Whether `identity` may take the Lease: nobody holds it, it holds it already, or the
    holder's renewal has not changed for the lease duration, timed on this machine's clock
    since this candidate first saw that renewal (not by comparing the two machines' clocks)."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:
        return True
    return now - seen_renewal_at >= float(spec.get("leaseDurationSeconds") or 0)


class LeaderElector:
    """Acquire, hold and release the Lease; see the module docstring."""

    def __init__(self, kube: Kube, settings: LeaseSettings):
        self.kube = kube
        self.settings = settings
        self._acquired_at = datetime.now(UTC)

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease."""
        observed: tuple[str, float] | None = None  # (renewTime seen, when first seen here)
        while True:
            try:
                lease = await self._read()
                if lease is None:
                    if await self.kube.create(self._body()) is not None:
                        break
                    continue
                renewal = str((lease.get("spec") or {}).get("renewTime"))
                if observed is None or observed[0] != renewal:
                    observed = (renewal, time.monotonic())
                if free_for(lease, self.settings.identity, observed[1], time.monotonic()):
                    self._acquired_at = datetime.now(UTC)
                    if await self._write(lease):
                        break
            except (KubeError, OSError, TimeoutError) as error:
                logger.warning("cannot take the Lease yet: %r", error)
            await asyncio.sleep(self.settings.retry_seconds)
        metrics.LEADER.set(1)
        logger.info("leading: holding Lease %s/%s", self.settings.namespace, self.settings.name)

    async def hold(self) -> None:
        """Renew until a renewal cannot be made within the deadline; then return, and the
        caller must stop acting at once."""
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self.settings.renew_seconds)
            while True:
                if await self._renew():
                    last_renewal = time.monotonic()
                    break
                if time.monotonic() - last_renewal >= self.settings.deadline_seconds:
                    metrics.LEADER.set(0)
                    logger.error("lost Lease %s/%s", self.settings.namespace, self.settings.name)
                    return
                await asyncio.sleep(self.settings.retry_seconds)

    async def release(self) -> None:
        """Give the Lease up on a clean stop, so that a standby takes over at once."""
        lease = await self._read()
        if lease is not None and (lease.get("spec") or {}).get("holderIdentity") == (
            self.settings.identity
        ):
            version = lease["metadata"]["resourceVersion"]
            patch = {"metadata": {"resourceVersion": version}, "spec": {"holderIdentity": None}}
            await self._patch(patch)
        metrics.LEADER.set(0)

    async def _renew(self) -> bool:
        try:
            lease = await self._read()
            holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
            if lease is None or holder != self.settings.identity:
                return False
            return await self._write(lease)
        except (KubeError, OSError, TimeoutError) as error:
            logger.warning("cannot renew the Lease: %r", error)
            return False

    async def _read(self) -> dict[str, Any] | None:
        s = self.settings
        return await self.kube.get(API_VERSION, "Lease", s.namespace, s.name)

    def _body(self) -> dict[str, Any]:
        return lease_body(self.settings, datetime.now(UTC), self._acquired_at)

    async def _write(self, lease: dict[str, Any]) -> bool:
        """Take or renew the Lease read as `lease`; False if someone wrote it meanwhile."""
        body = self._body()
        body["metadata"]["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return await self._patch(body)

    async def _patch(self, body: dict[str, Any]) -> bool:
        s = self.settings
        try:
            return (
                await self.kube.patch(API_VERSION, "Lease", s.namespace, s.name, body) is not None
            )
        except KubeError as error:
            if error.status == 409:  # another candidate wrote first
                return False
            raise
