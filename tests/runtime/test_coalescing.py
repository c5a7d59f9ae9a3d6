"""Batch times that fall due while a batch runs are coalesced under backpressure (scheduler.py):
the latest runs, sized when it starts; the earlier ones are not batches. Windows and state must
stay exact over them, however many there are, and a restart must replay them as they were.

The job runs on a manual clock: its first output blocks until the clock has moved many intervals
on, so those times are due together when the next batch starts.
"""

from __future__ import annotations

import operator
import threading
from collections import Counter
from typing import Any

from conditions import eventually
from dstream import StreamingContext
from dstream.runtime.checkpoint.directory import CheckpointDir
from dstream.runtime.control.backpressure import PIDRateEstimator, RateController
from dstream.runtime.scheduling.clock import ManualClock
from dstream.worker import textgen
from streams import BATCH_TIMEOUT_S

SEED, BYTES, RATE = 3, 40, 50
WINDOW_BATCHES = 5
GAP = 120  # intervals that pass during the blocked batch


# The gate of the first test: module-level, so that the checkpointed graph pickles the gate
# function by reference (threading.Event objects cannot be pickled by value).
BLOCKED, ENTERED, RELEASE = threading.Event(), threading.Event(), threading.Event()


def gate(_kind: str) -> None:
    """Hold the output of the batch that starts once BLOCKED is set, until RELEASE."""
    if BLOCKED.is_set() and not RELEASE.is_set():
        ENTERED.set()
        RELEASE.wait(BATCH_TIMEOUT_S)


def no_gate(_kind: str) -> None:
    """Let every output through."""


def add_counts(new: list[int], total: int | None) -> int:
    return (total or 0) + sum(new)


def words(line: str) -> list[tuple[str, int]]:
    return [(word, 1) for word in line.split()]


def counts_between(starts: list[int], ends: list[int]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for partition, (start, end) in enumerate(zip(starts, ends, strict=True)):
        for line in textgen.lines(SEED, BYTES, partition, start, end):
            counts.update(line.split())
    return dict(counts)


def build(sc, checkpoint: str, monkeypatch, outputs: dict[int, dict[str, Any]], gate) -> Any:
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    ssc.checkpoint(checkpoint)
    lines = ssc.rateStream(RATE, 2, SEED, BYTES)
    pairs = lines.flatMap(words)
    totals = pairs.updateStateByKey(add_counts)
    window = pairs.reduceByKeyAndWindow(operator.add, operator.sub, WINDOW_BATCHES, 1)

    def record(kind: str):
        def keep(time, rdd) -> None:
            gate(kind)
            outputs.setdefault(int(time.timestamp() * 1000), {})[kind] = dict(rdd.collect())

        return keep

    totals.foreachRDD(record("totals"))
    window.filter(lambda kv: kv[1] > 0).foreachRDD(record("window"))
    controller = RateController(PIDRateEstimator(1000), initial_rate=RATE * 4)
    monkeypatch.setattr(ssc, "_rate_controllers", lambda: {lines.name: controller})
    return ssc


def advance(ssc, batches: int) -> None:
    for _ in range(batches):
        ssc._clock.advance(ssc._batch_ms)
        ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), BATCH_TIMEOUT_S)


def check(outputs: dict[int, dict[str, Any]], checkpoint: str) -> list[int]:
    """Every output whose batch the log still holds (older records are pruned) against the input
    its batches admitted; returns the coalesced times the log records."""
    log = CheckpointDir(checkpoint).load_log()
    records = {t: r["ranges"]["rate"] for t, r in log.records.items()}
    coalesced = sorted(t for r in log.records.values() for t in r.get("coalesced", []))
    checked = [t for t in outputs if t in records]
    assert len(checked) >= 6, f"the log holds only {sorted(records)}"
    for time_ms in checked:
        output = outputs[time_ms]
        end = [stop for _start, stop in records[time_ms]]
        assert output["totals"] == counts_between([0, 0], end), time_ms
        in_window = [t for t in records if time_ms - WINDOW_BATCHES * 1000 < t <= time_ms]
        start = [begin for begin, _stop in records[min(in_window)]]
        assert output["window"] == counts_between(start, end), time_ms
    return coalesced


def test_windows_and_state_stay_exact_over_many_coalesced_times(sc, monkeypatch, tmp_path):
    for event in (BLOCKED, ENTERED, RELEASE):
        event.clear()
    outputs: dict[int, dict[str, Any]] = {}
    checkpoint = str(tmp_path / "checkpoint")
    ssc = build(sc, checkpoint, monkeypatch, outputs, gate)
    ssc.start()
    advance(ssc, 8)
    BLOCKED.set()
    ssc._clock.advance(1000)  # batch 9 starts, and blocks in its first output
    assert ENTERED.wait(BATCH_TIMEOUT_S), "batch 9 never reached its output"
    for _ in range(GAP):
        ssc._clock.advance(1000)
    eventually(
        lambda: ssc._scheduler.pending_batches() >= GAP,
        BATCH_TIMEOUT_S,
        interval=0.01,
        message="the timer marking the times due",
    )
    RELEASE.set()
    ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), BATCH_TIMEOUT_S)
    advance(ssc, 6)
    ssc.stop(stopSparkContext=False)

    history = list(ssc._scheduler.history)
    merged = [b for b in history if b.coalesced]
    assert len(merged) == 1 and len(merged[0].coalesced) == GAP - 1, [
        (b.batch_time_ms, len(b.coalesced)) for b in history
    ]
    assert merged[0].numRecords() <= RATE * 4  # one interval's budget, not GAP intervals'
    coalesced = check(outputs, checkpoint)
    assert merged[0].batch_time_ms in outputs
    assert coalesced == merged[0].coalesced
    assert not any(t in outputs for t in coalesced), "a coalesced time wrote output"
    assert len(outputs) == 8 + 1 + 1 + 6


def test_a_restart_replays_a_batch_that_stood_for_coalesced_times(sc, monkeypatch, tmp_path):
    outputs: dict[int, dict[str, Any]] = {}
    checkpoint = str(tmp_path / "checkpoint")
    ssc = build(sc, checkpoint, monkeypatch, outputs, no_gate)
    ssc.start()
    advance(ssc, 7)
    ssc.stop(stopSparkContext=False)
    # Craft what a driver killed mid-batch leaves: the next batch logged, standing for three
    # coalesced times, with no commit.
    log = CheckpointDir(checkpoint)
    last = max(log.load_log().records)
    record = log.load_log().records[last]
    ends = [stop for _start, stop in record["ranges"]["rate"]]
    pending_ms = last + 4000
    log.write_batch(
        pending_ms,
        {
            "ranges": {"rate": [[end, end + 60] for end in ends]},
            "rateLimits": {"rate": RATE * 4.0},
            "positions": {"rate": None},
            "coalesced": [last + 1000, last + 2000, last + 3000],
        },
    )

    again = build(sc, checkpoint, monkeypatch, outputs, no_gate)
    again._clock.advance(pending_ms)
    again.start()
    assert again._scheduler.recovery.replayed == [pending_ms]
    again._scheduler.wait_for_batch(pending_ms, BATCH_TIMEOUT_S)
    advance(again, 3)
    again.stop(stopSparkContext=False)
    assert check(outputs, checkpoint)[-3:] == [last + 1000, last + 2000, last + 3000]
    assert pending_ms in outputs
