"""Who leads a checkpoint, locally: a kernel lock for a quick takeover, an expiring lease for a
safe one.

The leader holds an exclusive `flock` on `<checkpoint>/leader.lock` for its whole life. The
kernel frees it the moment the holder dies (kill -9, a crash, an out-of-memory kill), so a
standby polling it takes over within a poll, without waiting for any timeout.

A lock alone is not enough: a holder that is frozen (SIGSTOP, a stalled VM, a debugger) or
stuck keeps its lock while doing nothing, and a standby would wait forever. So the leader also
renews a lease: the modification time of its epoch claim (fencing.py), touched every quarter of
`spark.dstream.lease.durationSeconds`. When the newest claim has not been renewed for a whole
duration, its leader counts as gone even though it holds the lock: the standby takes over
without it, claiming the next epoch. Should the old leader wake up, the fence stops it before
its next write (a record, a commit, a transaction of a transactional sink) and its renewal
thread finds the newer claim within a quarter of the duration, so it exits having committed
nothing more. The new leader takes the lock as soon as the old one lets go of it.

The kernel lock makes a crash's takeover fast; the lease makes a freeze's takeover possible;
the epoch makes both safe. The lease's clock is the file's modification time, set from the
clock of the machine (or, on NFS, the server) that stores the checkpoint, and read against this
machine's clock: keep the duration well above the clock skew between the drivers' machines.

With an epoch given by an election held elsewhere (GivenEpoch, from DSTREAM_EPOCH), the
driver claims it at once: the election decided, and the fence deposes whoever led before.

On Kubernetes the two drivers of a job live in different pods, so an `Election` replaces the
lock and the lease's expiry: the job's coordination.k8s.io/v1 Lease (kube_lease.py) decides who
leads, and the epoch is still claimed in the checkpoint, which is where every write is checked.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from dstream.runtime.leadership.fencing import (
    DeposedError,
    EpochLedger,
    EpochSource,
    Fence,
    GivenEpoch,
    claim_epoch,
)

log = logging.getLogger(__name__)

LOCK_FILE = "leader.lock"
DURATION_KEY = "spark.dstream.lease.durationSeconds"
KUBE_LEASE_KEY = "spark.dstream.lease.kubernetes"  # "<namespace>/<name>": elect by that Lease
DEFAULT_DURATION_S = 10.0
POLL_S = 0.1


class Election(Protocol):
    """Who leads, decided outside the checkpoint (the Kubernetes Lease of kube_lease.py)."""

    poll_s: float  # how often a standby asks

    def try_acquire(self) -> bool: ...

    def renew(self) -> str | None:
        """None while still elected, else why not (the lead is lost)."""
        ...

    def release(self) -> None: ...

    def describe(self) -> str: ...


class LeadLostError(DeposedError):
    """The election went to another driver, or could not be renewed in time: this driver must
    not write again (its successor's epoch would refuse it anyway)."""

    def __init__(self, epoch: int, election: str, why: str):
        RuntimeError.__init__(
            self,
            f"deposed: {why} ({election}) while this driver led at epoch {epoch}; another "
            "driver leads this checkpoint now, so this one commits nothing more and exits",
        )
        self.epoch, self.newer, self.holder = epoch, epoch, ""


class CheckpointInUseError(RuntimeError):
    """Another driver leads the checkpoint (it holds the lock and renews its lease)."""


class CheckpointLease:
    """The lead of one checkpoint: taken by `acquire`, renewed until `release`."""

    def __init__(
        self,
        checkpoint_path: str | Path,
        duration_s: float,
        source: EpochSource,
        election: Election | None = None,
    ):
        self.path = Path(checkpoint_path)
        self.ledger = EpochLedger(self.path)
        self.duration_s = duration_s
        self._source = source
        self._election = election
        self._lock_fd: int | None = None
        self._released = threading.Event()
        self._renewer: threading.Thread | None = None
        self.fence: Fence | None = None
        self.taken_by = ""  # how the lead was taken: "lock", "expiry", "election" or "lease"

    def acquire(self, wait: bool) -> Fence:
        """Take the lead: when the lock is free, or the newest claim's lease has expired, or an
        election held elsewhere gave this driver its epoch; then claim the next epoch. With
        `wait` (a standby) poll until then; without, a lead held by a live driver raises
        CheckpointInUseError."""
        announced = False
        while (fence := self.try_acquire()) is None:
            newest = self.ledger.newest()
            if not wait:
                raise CheckpointInUseError(
                    f"checkpoint {self.path} is led by another driver ({self._describe(newest)}), "
                    "which holds its lock and renews its lease: stop it first, or run this one "
                    "with --standby to take over when it is gone"
                )
            if not announced:
                log.info(
                    "standby: waiting for the lead of %s (%s)", self.path, self._describe(newest)
                )
                announced = True
            self._released.wait(self._election.poll_s if self._election else POLL_S)
        return fence

    def try_acquire(self) -> Fence | None:
        """Take the lead if it can be taken now (see acquire) and claim the next epoch; None
        when another driver holds it."""
        self.taken_by = self._takeable()
        if not self.taken_by:
            return None
        self.fence = claim_epoch(self.ledger, self._source)
        # A lease taken by expiry means its holder stalled: worth a warning.
        level = logging.WARNING if self.taken_by == "expiry" else logging.INFO
        log.log(
            level,
            "leading checkpoint %s at epoch %d (taken by %s)",
            self.path,
            self.fence.epoch,
            self.taken_by,
        )
        return self.fence

    def _takeable(self) -> str:
        """How the lead can be taken now ("" when it cannot)."""
        if isinstance(self._source, GivenEpoch):
            return "election"
        if self._election is not None:
            return "lease" if self._election.try_acquire() else ""
        if self._try_lock():
            return "lock"
        if self.expired_for() > 0:
            return "expiry"
        return ""

    def expired_for(self) -> float:
        """Seconds since the newest claim's lease expired (<= 0: not expired, or no claim)."""
        newest = self.ledger.newest()
        renewed = self.ledger.renewed_at(newest) if newest else None
        if renewed is None:
            return 0.0
        return time.time() - renewed - self.duration_s

    def _describe(self, epoch: int) -> str:
        if self._election is not None:
            return self._election.describe()
        if not epoch:
            return "a driver from before epochs"
        holder = self.ledger.holder(epoch) or "unknown"
        return f"epoch {epoch}, {holder}"

    def _try_lock(self) -> bool:
        """Take the kernel lock if no other process holds it. The descriptor is not inherited
        by the JVM or the workers (Python opens it close-on-exec), so the lock dies with this
        process alone; it is opened read-only (flock needs no more), so the checkpoint's file
        system can still be remounted read-only while the leader holds it."""
        if self._lock_fd is not None:
            return True
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def start_renewing(self, on_deposed: Callable[[DeposedError], None]) -> None:
        """Renew the lease every quarter of its duration until released; a newer claim found
        meanwhile calls `on_deposed` once and ends the renewals."""
        self._renewer = threading.Thread(
            target=self._renew_loop, args=(on_deposed,), name="dstream-lease", daemon=True
        )
        self._renewer.start()

    def _renew_loop(self, on_deposed: Callable[[DeposedError], None]) -> None:
        assert self.fence is not None
        while not self._released.wait(self.duration_s / 4):
            try:
                self.fence.check()
                self.ledger.renew(self.fence.epoch)
            except DeposedError as error:
                log.error("%s", error)
                on_deposed(error)
                return
            except OSError as error:
                log.warning("renewing the lease of %s failed: %s", self.path, error)
            if self._election is None:
                self._try_lock()  # taken by expiry: the lock too, once the old leader lets go
                continue
            lost = self._election.renew()
            if lost is not None:
                error = LeadLostError(self.fence.epoch, str(self._election), lost)
                log.error("%s", error)
                on_deposed(error)
                return

    def release(self) -> None:
        """Stop renewing and let go of the lock (a standby then takes over within a poll)."""
        self._released.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._election is not None and self.fence is not None:
            self._election.release()
