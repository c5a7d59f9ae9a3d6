"""Epochs, the fence and the local lease, on real files and real kernel locks (no Spark): two
drivers of one checkpoint are two CheckpointLease objects here, as flock() locks of separate
opens conflict within one process as they do between processes."""

from __future__ import annotations

import json
import os

import pytest
from conditions import eventually
from dstream.runtime.checkpoint.directory import CheckpointDir, LogConflictError
from dstream.runtime.checkpoint.files import write_document
from dstream.runtime.leadership.fencing import (
    EPOCH_ENV,
    DeposedError,
    EpochLedger,
    GivenEpoch,
    NextEpoch,
    claim_epoch,
    epoch_source_from_env,
)
from dstream.runtime.leadership.leader import move_aside_keeping_epoch
from dstream.runtime.leadership.lease import CheckpointInUseError, CheckpointLease, LeadLostError


def test_epochs_rise_and_each_is_claimed_once(tmp_path):
    ledger = EpochLedger(tmp_path)
    assert ledger.newest() == 0
    assert [claim_epoch(ledger, NextEpoch()).epoch for _ in range(3)] == [1, 2, 3]
    assert not ledger.claim(3)  # a second driver racing for epoch 3 loses
    with pytest.raises(DeposedError, match="epoch 3 was claimed"):
        claim_epoch(ledger, GivenEpoch(2))  # an election older than the newest claim
    assert claim_epoch(ledger, GivenEpoch(7)).epoch == 7


def test_starting_fresh_moves_the_checkpoint_aside_but_epochs_go_on(tmp_path):
    """A sink remembers the epochs that wrote to it, so a fresh start must not count from 1."""
    checkpoint = tmp_path / "checkpoint"
    ledger = EpochLedger(checkpoint)
    for _ in range(3):
        claim_epoch(ledger, NextEpoch())
    (checkpoint / "metadata").write_text("{}")
    moved = move_aside_keeping_epoch(checkpoint)
    assert moved is not None and (moved / "metadata").exists()
    assert sorted(p.name for p in checkpoint.iterdir()) == ["epochs"]
    assert EpochLedger(checkpoint).claims() == [3]
    assert EpochLedger(checkpoint).holder(3) == EpochLedger(moved).holder(3)
    assert claim_epoch(EpochLedger(checkpoint), NextEpoch()).epoch == 4
    assert move_aside_keeping_epoch(tmp_path / "none") is None


def test_an_elected_epoch_comes_from_the_environment(monkeypatch, tmp_path):
    assert isinstance(epoch_source_from_env(), NextEpoch)
    monkeypatch.setenv(EPOCH_ENV, "4")  # the Kubernetes Lease's leaseTransitions
    assert epoch_source_from_env() == GivenEpoch(4)
    lease = CheckpointLease(tmp_path, 30, epoch_source_from_env())
    assert (lease.acquire(wait=False).epoch, lease.taken_by) == (4, "election")
    monkeypatch.setenv(EPOCH_ENV, "four")
    with pytest.raises(ValueError, match=f"{EPOCH_ENV} must be a positive integer, got 'four'"):
        epoch_source_from_env()


def test_log_entries_carry_the_epoch_and_are_never_replaced(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    fence = claim_epoch(EpochLedger(tmp_path), NextEpoch())
    checkpoint.write_batch(1000, {"ranges": {"rate": [[0, 5]]}}, fence)
    checkpoint.write_batch(1000, {"ranges": {"rate": [[0, 5]]}}, fence)  # a retry: the same
    with pytest.raises(LogConflictError, match="written under epoch 1"):
        checkpoint.write_batch(1000, {"ranges": {"rate": [[0, 6]]}}, fence)
    checkpoint.write_commit(1000, {"state": {}}, fence)
    found = checkpoint.load_log()
    assert found.records[1000]["ranges"] == {"rate": [[0, 5]]}
    assert (found.records[1000]["epoch"], found.commits[1000]["epoch"]) == (1, 1)


def test_a_deposed_writer_is_refused_naming_the_newer_epoch(tmp_path):
    checkpoint, ledger = CheckpointDir(tmp_path), EpochLedger(tmp_path)
    old = claim_epoch(ledger, NextEpoch())
    checkpoint.write_batch(1000, {"ranges": {}}, old)
    new = claim_epoch(ledger, NextEpoch())
    with pytest.raises(DeposedError, match=r"epoch 2 was claimed by .* held epoch 1"):
        checkpoint.write_commit(1000, {"state": {}}, old)
    checkpoint.write_commit(1000, {"state": {}}, new)
    assert checkpoint.load_log().commits[1000]["epoch"] == 2


def test_a_checkpoint_from_before_epochs_reads_as_epoch_0(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    write_document(checkpoint.log_dir / "batch-1000.json", {"time": 1000, "ranges": {}})
    assert checkpoint.load_log().newest_epoch == 0
    assert claim_epoch(EpochLedger(tmp_path), NextEpoch()).epoch == 1
    assert "epoch" not in json.loads((checkpoint.log_dir / "batch-1000.json").read_text())["body"]


def test_the_lock_keeps_a_second_driver_out_until_released(tmp_path):
    leader = CheckpointLease(tmp_path, 30, NextEpoch())
    assert leader.acquire(wait=False).epoch == 1
    second = CheckpointLease(tmp_path, 30, NextEpoch())
    with pytest.raises(CheckpointInUseError, match=r"led by another driver \(epoch 1, .*--standby"):
        second.acquire(wait=False)
    leader.release()
    assert second.acquire(wait=False).epoch == 2
    assert second.taken_by == "lock"
    second.release()


def test_a_frozen_leader_loses_its_lease_and_wakes_up_deposed(tmp_path):
    """The leader holds the lock but stops renewing (frozen): once the lease has expired the
    standby takes over without the lock; the old leader's next check or renewal is refused, and
    the new leader takes the lock when the old one lets go of it."""
    frozen = CheckpointLease(tmp_path, 0.5, NextEpoch())
    frozen.acquire(wait=False)  # never renews: start_renewing is not called
    standby = CheckpointLease(tmp_path, 0.5, NextEpoch())
    fence = standby.acquire(wait=True)
    assert (fence.epoch, standby.taken_by) == (2, "expiry")
    with pytest.raises(DeposedError, match="epoch 2 was claimed"):
        frozen.fence.check()
    deposed: list[DeposedError] = []
    frozen.start_renewing(deposed.append)
    eventually(lambda: deposed, 10)
    standby_deposed: list[DeposedError] = []
    standby.start_renewing(standby_deposed.append)
    frozen.release()
    eventually(lambda: standby._lock_fd is not None, 10)  # its renewals took the lock
    third = CheckpointLease(tmp_path, 30, NextEpoch())
    with pytest.raises(CheckpointInUseError):
        third.acquire(wait=False)  # the new leader renews its lease and holds the lock
    standby.release()
    assert not standby_deposed


class Ballot:
    """An election decided outside the checkpoint, as the Kubernetes Lease is
    (runtime/kube_lease.py, tested on the real API server in tests/k8s/test_driver_lease.py)."""

    poll_s = 0.01

    def __init__(self) -> None:
        self.holder: str | None = None
        self.lost: str | None = None

    def for_(self, name: str) -> Vote:
        return Vote(self, name)


class Vote:
    """One driver's view of the Ballot."""

    def __init__(self, ballot: Ballot, name: str):
        self.ballot, self.name = ballot, name
        self.poll_s = ballot.poll_s

    def try_acquire(self) -> bool:
        if self.ballot.holder in (None, self.name):
            self.ballot.holder = self.name
            return True
        return False

    def renew(self) -> str | None:
        return None if self.ballot.holder == self.name else f"held by {self.ballot.holder}"

    def release(self) -> None:
        if self.ballot.holder == self.name:
            self.ballot.holder = None

    def describe(self) -> str:
        return f"the ballot, held by {self.ballot.holder}"


def test_an_election_replaces_the_lock_and_its_loss_deposes_the_leader(tmp_path):
    """With an Election the lock and the lease's expiry elect nobody: only the election does;
    the epoch is still claimed in the checkpoint, and a leader that loses the election is
    deposed by its renewals (LeadLostError, exit 6); a clean stop releases the election."""
    ballot = Ballot()
    leader = CheckpointLease(tmp_path, 0.2, NextEpoch(), ballot.for_("a"))
    assert (leader.acquire(wait=False).epoch, leader.taken_by) == (1, "lease")
    follower = CheckpointLease(tmp_path, 0.2, NextEpoch(), ballot.for_("b"))
    with pytest.raises(CheckpointInUseError, match="the ballot, held by a"):
        follower.acquire(wait=False)
    deposed: list[DeposedError] = []
    leader.start_renewing(deposed.append)
    ballot.holder = "b"  # the Lease went to b: a's renewals see it
    (error,) = eventually(lambda: deposed, 10)
    assert isinstance(error, LeadLostError)
    assert "deposed: held by b" in str(error) and "at epoch 1" in str(error)
    leader.release()
    assert follower.acquire(wait=True).epoch == 2  # held by b already: b leads at once
    follower.release()
    assert ballot.holder is None  # a clean stop lets the other driver in at once


def test_a_deposed_leaders_prune_leaves_the_newer_leaders_checkpoints(tmp_path):
    """A leader frozen past its fence check in the middle of a prune wakes up after a newer
    leader has written state checkpoints in its own run's directory: it must not delete them,
    while the newer leader still clears what the older runs left."""
    ledger, checkpoint = EpochLedger(tmp_path), CheckpointDir(tmp_path)
    old, new = claim_epoch(ledger, NextEpoch()), claim_epoch(ledger, NextEpoch())
    assert old.claimed_at == os.stat(ledger.path(1)).st_mtime <= new.claimed_at

    def state_checkpoint(run: str, written_at: float):
        directory = checkpoint.state_dir / run / "rdd-7"
        directory.mkdir(parents=True)
        (directory / "part-00000").write_bytes(b"x")
        os.utime(directory, (written_at, written_at))
        return directory

    old_runs = state_checkpoint("old-run", old.claimed_at - 60)  # superseded, in nobody's force
    newer_leaders = state_checkpoint("new-run", new.claimed_at + 1)
    checkpoint.prune(0, set(), f"file:{tmp_path}/state/deposed-run", old.claimed_at)
    assert newer_leaders.exists() and not old_runs.exists()

    late_write = state_checkpoint("deposed-run", new.claimed_at + 2)  # after it lost the lead
    in_force = {f"file:{newer_leaders}"}
    checkpoint.prune(0, in_force, f"file:{newer_leaders.parent}", new.claimed_at)
    assert newer_leaders.exists()
    assert late_write.exists(), "left for a later leader: written after this one's claim"
