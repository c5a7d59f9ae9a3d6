"""A driver's leadership of its checkpoint, behind one object: take the lead (or, as a standby
whose lead is held, follow the checkpoint until it is free), keep it while renewing, learn of
being deposed, let it go.

The lead is a lease (lease.py: the local lock and expiring claim, or the job's Kubernetes Lease
when the SparkConf names one) under a new epoch (fencing.py). The `Fence` of that epoch is what
every writer checks: the scheduler hands it to the checkpoint's writes and to the sinks that
check it inside their own transactions, with every batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dstream.runtime.checkpoint.directory import move_checkpoint_aside
from dstream.runtime.checkpoint.files import create_exclusively
from dstream.runtime.leadership.fencing import (
    DeposedError,
    EpochLedger,
    Fence,
    epoch_source_from_env,
)
from dstream.runtime.leadership.follower import CheckpointFollower
from dstream.runtime.leadership.lease import (
    DEFAULT_DURATION_S,
    DURATION_KEY,
    KUBE_LEASE_KEY,
    CheckpointLease,
    Election,
)
from dstream.runtime.leadership.shadow import Shadow

if TYPE_CHECKING:
    from pyspark import SparkContext

    from dstream.runtime.checkpoint.directory import CheckpointDir
    from dstream.runtime.scheduling.graph import DStreamGraph


def _kube_lease(where: str | None, duration_s: float) -> Election | None:
    """The job's Kubernetes Lease when the conf names one; its module is imported only then,
    as the kubernetes client takes most of a second to import."""
    if not where:
        return None
    from dstream.runtime.leadership.kube_lease import kube_lease

    return kube_lease(where, duration_s)


class Leadership:
    """The lead of one checkpoint for the run of one driver. `on_deposed` is called (from the
    renewal thread) when a newer driver takes the checkpoint over."""

    def __init__(
        self,
        sc: SparkContext,
        graph: DStreamGraph,
        checkpoint: CheckpointDir,
        on_deposed: Callable[[DeposedError], None],
    ):
        self._sc = sc
        self._graph = graph
        self._checkpoint = checkpoint
        self._on_deposed = on_deposed
        self.lease: CheckpointLease | None = None
        self.fence: Fence | None = None
        self._follower: CheckpointFollower | None = None

    def take(self, standby: bool, following: Callable[[], None] = lambda: None) -> Fence:
        """Hold the lease under a new epoch and start renewing it. A standby whose lead is held
        follows the checkpoint meanwhile (`following` is called as it starts); one that finds
        the lead free leads at once: following first would only delay its first batch."""
        conf = self._sc.getConf()
        duration_s = float(conf.get(DURATION_KEY, str(DEFAULT_DURATION_S)))
        election = _kube_lease(conf.get(KUBE_LEASE_KEY), duration_s)
        self.lease = CheckpointLease(
            self._checkpoint.path, duration_s, epoch_source_from_env(), election
        )
        fence = self.lease.try_acquire() if standby else self.lease.acquire(wait=False)
        if fence is None:
            following()
            shadow = Shadow(self._sc, self._graph, self._checkpoint)
            self._follower = CheckpointFollower(self._sc, self._checkpoint, shadow)
            self._follower.start()
            fence = self.lease.acquire(wait=True)
        self.fence = fence
        self.lease.start_renewing(self._on_deposed)
        return fence

    def stop_following(self) -> tuple[frozenset[str], Shadow | None]:
        """What following left for recovery: the state checkpoints read through, and the
        shadow of the leader's state (nothing when this driver led at once)."""
        if self._follower is None:
            return frozenset(), None
        return self._follower.stop(), self._follower.shadow

    @property
    def shadow(self) -> Shadow | None:
        """The shadow of the leader's state while this driver follows the checkpoint."""
        return self._follower.shadow if self._follower is not None else None

    def hand_over(self) -> None:
        """Let go of the lease now, for a standby to take over at once; this driver's writes
        go on under its epoch until the standby claims the next one (then they are refused)."""
        if self.lease is not None:
            self.lease.release()


def move_aside_keeping_epoch(path: str | Path) -> Path | None:
    """Start fresh (move the checkpoint aside) with the epochs going on from the old newest
    claim, which is carried into the new directory: a sink that checks epochs in its own
    transactions (PostgreSQL's `dstream_epochs`, Kafka's commit records) remembers the drivers
    before, and would refuse a new one counting from 1 as deposed."""
    newest = EpochLedger(path).newest()
    moved = move_checkpoint_aside(path)
    if moved is None or newest == 0:
        return moved
    old, new = EpochLedger(moved), EpochLedger(path)
    new.directory.mkdir(parents=True, exist_ok=True)
    create_exclusively(new.path(newest), old.holder(newest).encode())
    renewed = old.renewed_at(newest)
    if renewed is not None:  # the carried claim's lease is as old as it was
        os.utime(new.path(newest), (renewed, renewed))
    return moved
