"""The observer's reading of the batch log: which commits a new driver made."""

from __future__ import annotations

from e2e.chaos.observer import Snapshot


def test_a_new_drivers_commits_are_told_apart_by_their_epoch():
    """After a driver loss the old driver may still commit while it stops, after the new pod
    started: only commits of a newer epoch are the new driver's."""
    snapshot = Snapshot(
        ranges={},
        coalesced={},
        commits={1000: 10.0, 2000: 13.0, 3000: 12.0, 4000: 20.0},
        max_drivers=1,
        epochs={1000: 1, 2000: 1, 3000: 2, 4000: 2},
    )
    assert snapshot.committed_after(11.0) == [3000, 2000, 4000]
    assert snapshot.committed_above(1) == [3000, 4000]
    assert snapshot.committed_above(2) == []


def test_the_wait_for_schedule_from_a_moment_without_a_fault():
    """6 s batches committed 2 s after their time, one late (9 s): from a moment, the next due
    batch within the limit; the late one is passed over."""
    commits = {6000: 8.0, 12000: 14.0, 18000: 27.0, 24000: 26.0}
    snapshot = Snapshot(ranges={}, coalesced={}, commits=commits, max_drivers=1, epochs={})
    assert snapshot.first_on_schedule_after(12.0, limit_s=8.0) == 24000
    assert snapshot.first_on_schedule_after(24.0, limit_s=8.0) is None
    waits = snapshot.waits_for_schedule(list(commits), limit_s=8.0, step_s=1.0)
    assert waits == [8, 7, 6, 5, 4, 3, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3]


def test_on_schedule_for_good_passes_over_a_batch_on_time_before_the_fault_hit():
    """6 s batches, a fault at 10 s: the 12 s batch is still on time, the next two are late,
    then the job holds its schedule; a batch committed after the next fault is not read."""
    commits = {12000: 14.0, 18000: 27.0, 24000: 33.0, 30000: 33.5, 36000: 38.0, 42000: 52.0}
    snapshot = Snapshot(ranges={}, coalesced={}, commits=commits, max_drivers=1, epochs={})
    assert snapshot.first_on_schedule_after(10.0, limit_s=8.0) == 12000
    assert snapshot.on_schedule_for_good(10.0, until_s=45.0, limit_s=8.0) == 30000
    assert snapshot.on_schedule_for_good(10.0, until_s=None, limit_s=8.0) is None
