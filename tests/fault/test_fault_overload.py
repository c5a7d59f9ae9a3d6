"""A driver SIGKILLed while backpressure holds a 10x overload, then restarted: every admitted
record is counted exactly once.

The faultapp job (per-batch counts, running totals, a window) runs with backpressure on a rate
source offering about ten times what it sustains (each record costs 200 µs), so batch sizes
follow the rate limit and due batch times are coalesced. The reference comes from what the
batch log says was admitted: the newest batch record's ranges end where admission stopped, and
every batch starts where the one before ended, so the counts summed over every batch directory
must equal the input's counts over [0, end), the last batch's totals must equal the initials'
counts over the same records, and its window the counts of the records its window's batches
admitted.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from conditions import eventually
from dstream.runtime.checkpoint.directory import CheckpointDir
from fault.harness import RateJob, batch_dirs, read_batch, word_counts
from running_driver import Driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TIMEOUT_S = 240
# Batches committed before the kill: past the first state checkpoints (every 2 batches) and the
# rate limit's first estimates, so the kill lands in a steady overload with state to recover.
BEFORE_KILL = 5
# Batches the restart commits after the newest one before the kill: the recovered totals and
# window go into each of them.
AFTER_RESTART = 4
RECORD_MICROS = 200  # 5,000 records/s per task slot, 10,000/s on local[2]: 100,000/s is 10x


def committed(job: RateJob) -> set[int]:
    """Committed batch times, by file name (a live driver's log must not be loaded)."""
    return {int(p.stem.split("-")[1]) for p in (job.checkpoint / "log").glob("commit-*.json")}


def initials(counts: Counter[str]) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for word, n in counts.items():
        totals[word[0]] += n
    return dict(totals)


def test_sigkill_during_overload_loses_and_repeats_nothing(tmp_path: Path):
    job = RateJob(
        tmp_path,
        batch_s=2,  # the faultapp's fixed cost per batch must stay well under the interval
        rate=100_000,
        record_micros=RECORD_MICROS,
        window_s=10,
        checkpoint_interval_s=4,
        extra_spec={"backpressure": {"enabled": True, "initialRate": 20_000}},
    )
    job.write()
    first = Driver(job.manifest, log=tmp_path / "first.log").start()
    try:
        eventually(lambda: len(committed(job)) >= BEFORE_KILL, TIMEOUT_S)
    finally:
        first.kill()
    killed_at = max(committed(job))

    again = Driver(job.manifest, log=tmp_path / "again.log").start()
    try:
        eventually(
            lambda: len([t for t in committed(job) if t > killed_at]) >= AFTER_RESTART, TIMEOUT_S
        )
        assert again.terminate(timeout_s=120, whole_group=True) == 0
    finally:
        again.kill()

    found = CheckpointDir(job.checkpoint).load_log()
    assert not found.pending, "a graceful stop leaves every logged batch committed"
    last = max(found.records)
    end = [stop for _start, stop in found.records[last]["ranges"]["rate"]]
    admitted = word_counts(job, [0] * job.partitions, end)
    outputs = {t: read_batch(d) for t, d in batch_dirs(job.out).items()}
    union: Counter[str] = sum((o.counts for o in outputs.values()), Counter())
    lost, twice = admitted - union, union - admitted
    assert not lost and not twice, f"lost {sum(lost.values())}, twice {sum(twice.values())}"
    assert outputs[last].totals == initials(admitted)

    window_start = last - job.window_s * 1000
    in_window = [t for t in found.records if window_start < t <= last]
    assert window_start + job.batch_s * 1000 in found.records or any(
        window_start + job.batch_s * 1000 in r.get("coalesced", []) for r in found.records.values()
    ), "the log keeps the first batch time of the last window"
    starts = [found.records[t]["ranges"]["rate"] for t in sorted(in_window)]
    assert in_window, "the log keeps the records of the last window"
    first_offsets = [start for start, _stop in starts[0]]
    assert outputs[last].window == dict(word_counts(job, first_offsets, end))

    coalesced = sum(len(r.get("coalesced", [])) for r in found.records.values())
    limits = [r["rateLimits"]["rate"] for r in found.records.values()]
    print(
        f"\n{len(outputs)} batches written, {sum(end):,} records admitted of "
        f"{job.rate:,}/s offered, {coalesced} batch times coalesced in the log kept, "
        f"rate limits {min(limits):,.0f}..{max(limits):,.0f}/s; "
        f"records of the last batch: {json.dumps(found.records[last]['ranges'])}"
    )
