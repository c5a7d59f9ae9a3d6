"""A batch as the scheduler runs it: its timing and input (`BatchInfo`, whose accessors mirror
Spark's), the event listeners receive, and how its run ended (`BatchOutcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from dstream.runtime.control.latency import BatchLatency
from dstream.runtime.timeutil import datetime_of


@dataclass
class BatchInfo:
    """One batch's timing and input; the accessors mirror Spark's BatchInfo (milliseconds)."""

    batch_time_ms: int
    submission_time_ms: int
    records: dict[str, int]
    rate_limits: dict[str, float | None]
    kind: str = "live"
    processing_start_ms: int | None = None
    processing_end_ms: int | None = None
    error: str | None = None
    coalesced: list[int] = field(default_factory=list)  # earlier due times merged into this one
    ranges: dict[str, Any] = field(default_factory=dict)  # each source's recorded input range
    # sources whose budget held back available records (backpressure learns from those only)
    limited: dict[str, bool] = field(default_factory=dict)
    retries: int = 0  # record, outputs or commit run again after failing (failure.py)
    skipped: bool = False  # failed for good, committed as skipped (failurePolicy onExhausted)
    state_checkpoints: dict[str, Any] = field(default_factory=dict)
    checkpoint_seconds: float | None = None  # writing the batch record + commit marker
    # end-to-end, availability at the source -> output committed (runtime/latency.py); None
    # until committed, and when no source knows when its records became available
    latency: BatchLatency | None = None
    record: dict[str, Any] | None = field(default=None, repr=False)  # to write before outputs

    def batchTime(self) -> datetime:
        return datetime_of(self.batch_time_ms)

    def numRecords(self) -> int:
        return sum(self.records.values())

    def schedulingDelay(self) -> int | None:
        if self.processing_start_ms is None:
            return None
        return max(0, self.processing_start_ms - self.submission_time_ms)

    def processingDelay(self) -> int | None:
        if self.processing_start_ms is None or self.processing_end_ms is None:
            return None
        return self.processing_end_ms - self.processing_start_ms

    def totalDelay(self) -> int | None:
        scheduling, processing = self.schedulingDelay(), self.processingDelay()
        return None if scheduling is None or processing is None else scheduling + processing

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.batchTime().astimezone().isoformat(),
            "timeMs": self.batch_time_ms,
            "kind": self.kind,
            "records": self.numRecords(),
            "recordsBySource": self.records,
            "rateLimit": self.rate_limits,
            "schedulingDelaySeconds": _seconds(self.schedulingDelay()),
            "processingSeconds": _seconds(self.processingDelay()),
            "totalDelaySeconds": _seconds(self.totalDelay()),
            "coalescedBatches": len(self.coalesced),
            "retries": self.retries,
            "skipped": self.skipped,
            "error": self.error,
            "endToEndLatency": self.latency.to_json() if self.latency else None,
        }


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


class BatchEvent:
    """What listeners receive, shaped like pyspark.streaming's listener events."""

    def __init__(self, info: BatchInfo):
        self.info = info

    def batchInfo(self) -> BatchInfo:
        return self.info


@dataclass(frozen=True)
class BatchOutcome:
    """How a batch's run ended: `committed`; `skipped`, committed past outputs that failed for
    good under onExhausted: skip (`error` is their failure); or `uncommitted`, left in the log for
    a restart to run again (`error` is what stopped it)."""

    status: Literal["committed", "skipped", "uncommitted"]
    error: Exception | None = None
