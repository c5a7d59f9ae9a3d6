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
