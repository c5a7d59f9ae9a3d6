"""The fault suite's user app: per-batch word counts, running totals and windowed counts.

All three come out of one stream of (("kind", key), count) pairs so that a batch's output is one
directory written by the files sink, and the test checks every kind from the same committed batch:
- ("count", word): the batch's own word counts (summed over batches they equal the input's counts);
- ("total", initial): a running total per initial letter, through updateStateByKey (kept small);
- ("window", word): counts over the last `window` seconds, incrementally with an inverse function.
With `taskSleepSeconds`, every input task first sleeps that long, so that a test can kill an
executor while it is certainly in the middle of a batch; with `outputSleepSeconds`, every
output task sleeps that long after its last record (the durable batch the window subtracts is
written by then), so that a test can break the checkpoint between a batch's outputs and its
commit; with `recordMicros`, every record costs
that much wall-clock time (slept, not spun), so that a test can overload the job at a rate whose
reference is cheap to compute; with `readsLog`, every input partition computed notes which
batch's job computed it (note_reads). None of them changes the output. `counted` is the
lightest job (each batch's count), whose first batches can be made slow as a cold driver's are.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Iterator
from typing import Any

from dstream import StreamingContext
from dstream.dstream import DStream
from pyspark import TaskContext


def add_counts(new: list[int], total: int | None) -> int:
    """updateStateByKey's update: the running total grows by the batch's counts."""
    return (total or 0) + sum(new)


def pause_then_pass(seconds: float) -> Any:
    def pause(records: Iterator[str]) -> Iterator[str]:
        time.sleep(seconds)
        return records

    return pause


def pass_then_pause(seconds: float) -> Any:
    def pause(records: Iterator[Any]) -> Iterator[Any]:
        yield from records
        time.sleep(seconds)

    return pause


def pause_per_record(micros: float) -> Any:
    """Each partition waits `micros` per record it holds: the wall-clock cost of heavy records,
    without the CPU a spin would burn (the overload test would otherwise hold both cores for its
    whole run, starving the tests beside it, and slow down itself as they load the machine)."""

    def pause(records: Iterator[str]) -> Iterator[str]:
        held = list(records)
        time.sleep(len(held) * micros / 1e6)
        return iter(held)

    return pause


def note_reads(directory: str) -> Any:
    """Each input partition computed appends its first record and the job group of the batch
    whose job computed it (`dstream-batch-<time>`) to a file of its process: a record first
    seen in its own batch and again in a later batch's job is input read again from the
    source, to recompute what was lost."""

    def note(records: Iterator[str]) -> Iterator[str]:
        records = iter(records)
        first = next(records, None)
        if first is None:
            return
        group = TaskContext.get().getLocalProperty("spark.jobGroup.id")
        with open(os.path.join(directory, f"reads-{os.getpid()}"), "a") as log:
            log.write(json.dumps([group, first]) + "\n")
        yield first
        yield from records

    return note


_cold_batches_seen = 0  # batches of this driver process that passed cold_start


def cold_start(batches: int, seconds: float) -> Any:
    """The first `batches` batches of this process pause `seconds` on the driver: slow for no
    fault of their records, by the same amount on any machine (a module global, not the
    closure's state, so that a restarted driver is cold again)."""

    def pause(rdd: Any) -> Any:
        global _cold_batches_seen
        _cold_batches_seen += 1
        if _cold_batches_seen <= batches:
            time.sleep(seconds)
        return rdd

    return pause


def build(ssc: StreamingContext, lines: DStream, args: dict[str, Any]) -> DStream:
    if args.get("readsLog"):
        lines = lines.mapPartitions(note_reads(args["readsLog"]))
    if args.get("taskSleepSeconds"):
        lines = lines.mapPartitions(pause_then_pass(float(args["taskSleepSeconds"])))
    if args.get("recordMicros"):
        lines = lines.mapPartitions(pause_per_record(float(args["recordMicros"])))
    words = lines.flatMap(lambda line: ((word, 1) for word in line.split()))
    counts = words.reduceByKey(operator.add).cache()  # shared by all three outputs
    totals = counts.map(lambda kv: (kv[0][0], kv[1])).updateStateByKey(add_counts)
    windowed = counts.reduceByKeyAndWindow(
        operator.add,
        operator.sub,
        float(args["window"]),
        None,
        filterFunc=lambda kv: kv[1] > 0,
    )
    tagged = [
        counts.map(lambda kv: (("count", kv[0]), kv[1])),
        totals.map(lambda kv: (("total", kv[0]), kv[1])),
        windowed.map(lambda kv: (("window", kv[0]), kv[1])),
    ]
    united = ssc.union(*tagged)
    if args.get("outputSleepSeconds"):
        return united.mapPartitions(pass_then_pause(float(args["outputSleepSeconds"])))
    return united


def counted(ssc: StreamingContext, lines: DStream, args: dict[str, Any]) -> DStream:
    """Each batch's record count, the first batches slow if asked (cold_start): the lightest
    job, whose batches cost little more than a batch's fixed cost."""
    if args.get("coldBatches"):
        lines = lines.transform(cold_start(int(args["coldBatches"]), float(args["coldSeconds"])))
    return lines.count()


def passthrough(ssc: StreamingContext, lines: DStream, args: dict[str, Any]) -> DStream:
    """Every input record as it came: an output that a test compares record by record."""
    return lines
