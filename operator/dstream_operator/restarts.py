"""Whether and when a lost driver is replaced: the job's restartPolicy as pure decisions.

A new driver recovers from the checkpoint, so restarting is safe; what the policy bounds is how
often and how fast, so a driver that crashes on start cannot hammer the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dstream.spec import RestartPolicy


@dataclass(frozen=True)
class Termination:
    """A driver that ended without the operator asking it to."""

    failed: bool  # False only for a driver that exited successfully
    reason: str


@dataclass(frozen=True)
class Restart:
    """Replace the driver after `delay_seconds`; it will be restart number `attempt`."""

    delay_seconds: int
    attempt: int


@dataclass(frozen=True)
class GiveUp:
    """Leave the job Failed, saying why."""

    reason: str


def backoff_seconds(policy: RestartPolicy, restarts_so_far: int) -> int:
    """0 before the first restart: a driver lost once is most likely a node or a pod lost,
    and the checkpoint makes the restart safe, so waiting only delays the stream. From the
    second: backoffSeconds, doubled per further restart, capped at maxBackoffSeconds."""
    if restarts_so_far == 0:
        return 0
    doublings = min(restarts_so_far - 1, 32)
    return min(policy.backoff_seconds * 2**doublings, policy.max_backoff_seconds)


def stable_since(policy: RestartPolicy, ready_since: datetime | None, now: datetime) -> bool:
    """Whether a driver ready since `ready_since` has run long enough to reset the count."""
    if ready_since is None or policy.reset_after_seconds == 0:
        return False
    return (now - ready_since).total_seconds() >= policy.reset_after_seconds


def decide(policy: RestartPolicy, restarts_so_far: int, ended: Termination) -> Restart | GiveUp:
    """Apply the policy to a driver that ended; `restarts_so_far` counts earlier restarts."""
    if policy.type == "Never":
        return GiveUp(f"{ended.reason}; restartPolicy is Never")
    if policy.type == "OnFailure" and not ended.failed:
        return GiveUp(f"{ended.reason}; restartPolicy OnFailure does not restart a clean exit")
    if restarts_so_far >= policy.max_restarts:
        return GiveUp(f"{ended.reason}; maxRestarts ({policy.max_restarts}) reached")
    return Restart(backoff_seconds(policy, restarts_so_far), restarts_so_far + 1)
