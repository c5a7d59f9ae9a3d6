"""Helpers that drive a StreamingContext batch by batch on a manual clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conditions import eventually
from dstream import StreamingContext
from dstream.runtime.control.failure import BatchFailedError
from dstream.runtime.scheduling.clock import ManualClock

BATCH_TIMEOUT_S = 120


def manual_context(sc, batch_seconds: float = 1) -> StreamingContext:
    return StreamingContext(sc, batch_seconds, clock=ManualClock())


def run_batches(ssc: StreamingContext, batches: int) -> None:
    """Start (if needed), advance the clock one batch at a time, wait for each batch, stop."""
    if ssc._scheduler is None:
        ssc.start()
    clock = ssc._clock
    batch_ms = ssc._batch_ms
    for _ in range(batches):
        clock.advance(batch_ms)
        ssc._scheduler.wait_for_batch(clock.now_ms(), BATCH_TIMEOUT_S)
    ssc.stop(stopSparkContext=False)


def collect(stream, batches: int, sort: bool = False) -> list[list[Any]]:
    """The records of every batch of `stream`, in batch order."""
    results: list[list[Any]] = []

    def gather(rdd):
        records = rdd.collect()
        results.append(sorted(records) if sort else records)

    stream.foreachRDD(gather)
    run_batches(stream.context(), batches)
    return results


def run_op(
    sc,
    inputs: list[list[Any]],
    op: Callable[..., Any],
    batches: int | None = None,
    sort: bool = False,
    inputs2: list[list[Any]] | None = None,
    batch_seconds: float = 1,
) -> list[list[Any]]:
    """Apply op to a queueStream of `inputs` (and `inputs2`) and collect `batches` batches."""
    ssc = manual_context(sc, batch_seconds)
    first = ssc.queueStream(inputs)
    stream = op(first, ssc.queueStream(inputs2)) if inputs2 is not None else op(first)
    return collect(stream, batches or len(inputs), sort)


def final_failure(ssc: StreamingContext, timeout_s: float = 60) -> BatchFailedError:
    """The BatchFailedError that ended the run. awaitTermination raises each failed attempt
    first (the run outlives those); they are passed over here."""

    def failed() -> BatchFailedError | None:
        try:
            ssc.awaitTerminationOrTimeout(1)
        except BatchFailedError as failure:
            return failure
        except Exception:  # an attempt's failure
            pass
        return None

    return eventually(failed, timeout_s, interval=0, message="a BatchFailedError")


def assert_stamped_between(source, records: int, before_ms: int, after_ms: int) -> None:
    """A source whose records were stamped between before_ms and after_ms: a batch 5 s later,
    read twice, reports each record once, aged by its stamp, and its ages are taken once."""
    batch_ms = after_ms + 5000
    planned = source.plan(batch_ms, None)
    rdd = source.compute(batch_ms)
    assert len(rdd.collect()) == records and rdd.count() == records
    ages = source.record_ages(batch_ms, planned)
    assert ages is not None and sum(ages.values()) == records
    assert all(batch_ms - after_ms <= age <= batch_ms - before_ms for age in ages)
    assert source.record_ages(batch_ms, planned) is None  # taken once
