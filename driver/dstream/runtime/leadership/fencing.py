"""Epochs and the fence: two drivers on one checkpoint never both commit.

Leader election alone never guarantees a single leader: a driver frozen (SIGSTOP, a stalled VM)
or cut off while holding its lease wakes up believing it still leads. So every driver that takes
a checkpoint over claims a new *epoch*, higher than every epoch before it, and every batch record
and commit marker it writes carries it. Before each write the driver checks that no newer epoch
has been claimed; one that has been is a newer leader, and the driver stops (DeposedError). The
records themselves are created exclusively (never replaced), so of two drivers racing for the
same batch time exactly one record exists; transactional sinks check the epoch again inside
their own transaction (connectors/postgres.py), which closes the gap between the check and the
write for their output.

Claims live in the checkpoint as `epochs/epoch-<n>.json`, each created exclusively: creating a
file that must not exist (a hard link, atomic on local file systems and NFS alike) is a
compare-and-set, so two drivers claiming at once cannot get the same epoch. The newest claim is
also the leader's lease: the leader touches it while it lives (lease.py), so its modification
time says when the leader last showed it was alive.

Where an epoch comes from is pluggable (EpochSource): the next number after the newest claim
(`NextEpoch`), whether the lead was taken by the local lock or a Kubernetes Lease; or the number
an election held outside the driver hands in (`GivenEpoch`, from `DSTREAM_EPOCH`). Either way
the claim is recorded in the checkpoint, which is where writes are checked. A checkpoint
written before epochs existed has none: its records count as epoch 0. Starting fresh moves
the checkpoint aside but not its epochs (leader.py's `move_aside_keeping_epoch`): the transactional sinks
remember the epochs that wrote to them.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from dstream.runtime.checkpoint.files import create_exclusively

if TYPE_CHECKING:
    from datetime import datetime

    from pyspark import RDD

log = logging.getLogger(__name__)

EPOCH_ENV = "DSTREAM_EPOCH"
_EPOCH_FILE = re.compile(r"^epoch-(\d+)\.json$")
# Claims kept besides the newest (older ones only ever matter as "older than the newest").
_CLAIMS_KEPT = 8


class DeposedError(RuntimeError):
    """Another driver claimed a newer epoch of this checkpoint: this one must not write again."""

    def __init__(self, epoch: int, newer: int, holder: str = ""):
        self.epoch = epoch
        self.newer = newer
        self.holder = holder
        by = f" by {holder}" if holder else ""
        super().__init__(
            f"deposed: epoch {newer} was claimed{by} while this driver held epoch {epoch}; "
            "another driver leads this checkpoint now, so this one commits nothing more and exits"
        )


def holder_name() -> str:
    """Who claims an epoch, for the messages of the drivers it deposes."""
    return f"{socket.gethostname()}:{os.getpid()}"


class EpochLedger:
    """The claims of a checkpoint (`epochs/epoch-<n>.json`): who led it, from which epoch on."""

    def __init__(self, checkpoint_path: str | Path):
        self.directory = Path(checkpoint_path) / "epochs"

    def path(self, epoch: int) -> Path:
        return self.directory / f"epoch-{epoch}.json"

    def claims(self) -> list[int]:
        """Every claimed epoch, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for n in names if (m := _EPOCH_FILE.match(n)))

    def newest(self) -> int:
        """The newest claimed epoch; 0 when none was (a checkpoint from before epochs)."""
        claims = self.claims()
        return claims[-1] if claims else 0

    def holder(self, epoch: int) -> str:
        """Who claimed `epoch` ("" when unknown)."""
        try:
            return self.path(epoch).read_text().strip()
        except OSError:
            return ""

    def claim(self, epoch: int) -> bool:
        """Record the claim of `epoch`; False when another driver claimed it first."""
        try:
            create_exclusively(self.path(epoch), holder_name().encode())
        except FileExistsError:
            return False
        for old in self.claims()[:-_CLAIMS_KEPT]:
            self.path(old).unlink(missing_ok=True)
        return True

    def renew(self, epoch: int) -> None:
        """Show that the leader of `epoch` is alive: its claim's modification time is now."""
        os.utime(self.path(epoch))

    def renewed_at(self, epoch: int) -> float | None:
        """When the leader of `epoch` last renewed its claim (wall-clock seconds), or None."""
        try:
            return self.path(epoch).stat().st_mtime
        except FileNotFoundError:
            return None


class EpochSource(Protocol):
    """Which epoch a driver taking over claims, given the newest one claimed so far."""

    def next_epoch(self, newest: int) -> int: ...


class NextEpoch:
    """Locally: the number after the newest claim (the checkpoint's own counter)."""

    def next_epoch(self, newest: int) -> int:
        return newest + 1


@dataclass(frozen=True)
class GivenEpoch:
    """An epoch handed to the driver by what elected it (on Kubernetes the Lease's
    leaseTransitions, through DSTREAM_EPOCH); one not above the newest claim means a newer
    leader exists already."""

    epoch: int

    def next_epoch(self, newest: int) -> int:
        if self.epoch <= newest:
            raise DeposedError(self.epoch, newest)
        return self.epoch


def epoch_source_from_env() -> EpochSource:
    """GivenEpoch when DSTREAM_EPOCH is set (a positive integer), else NextEpoch."""
    given = os.environ.get(EPOCH_ENV)
    if not given:
        return NextEpoch()
    if not given.isdigit() or int(given) < 1:
        raise ValueError(f"{EPOCH_ENV} must be a positive integer, got {given!r}")
    return GivenEpoch(int(given))


@dataclass(frozen=True)
class Fence:
    """The epoch this driver writes under, checked against the ledger before every write, and
    when it was claimed by the checkpoint's own clock (the claim file's modification time
    then): every file a newer leader writes there is newer (inf: not known)."""

    ledger: EpochLedger
    epoch: int
    claimed_at: float = math.inf

    def check(self) -> None:
        """DeposedError when a newer epoch than this driver's has been claimed."""
        newest = self.ledger.newest()
        if newest > self.epoch:
            raise DeposedError(self.epoch, newest, self.ledger.holder(newest))

    def superseded(self) -> bool:
        """Whether a newer epoch than this driver's has been claimed (check() would raise)."""
        return self.ledger.newest() > self.epoch

    def check_written(self, newest_written: int) -> None:
        """DeposedError when the log holds an entry of a newer epoch than this driver's."""
        if newest_written > self.epoch:
            raise DeposedError(self.epoch, newest_written)


@runtime_checkable
class FencedWriter(Protocol):
    """An output that checks the fence inside its own transaction (the PostgreSQL and Kafka
    sinks), which closes the gap between the scheduler's check and its write: the batch's
    output operation hands it the fence its driver writes under (None without a checkpoint)."""

    def write_batch(self, time: datetime, rdd: RDD, fence: Fence | None) -> None: ...


def claim_epoch(ledger: EpochLedger, source: EpochSource) -> Fence:
    """Claim the next epoch from `source`, above every claim so far; retried when another
    driver claims the same number first."""
    while True:
        epoch = source.next_epoch(ledger.newest())
        if ledger.claim(epoch):
            log.info("claimed epoch %d of %s", epoch, ledger.directory.parent)
            claimed_at = ledger.renewed_at(epoch)  # None: deposed and its claim dropped already
            return Fence(ledger, epoch, 0.0 if claimed_at is None else claimed_at)
        time.sleep(0.01)  # lost the race for this number: read the newest again
