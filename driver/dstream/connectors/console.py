"""`sink.type: console`: each batch's first records printed (the demo's view; not a durable sink)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from pyspark import RDD

if TYPE_CHECKING:
    from dstream.spec import StreamingJob


class ConsoleSink:
    """Prints each batch's first (or, for counts, largest) records as they arrive."""

    def __init__(self, num: int = 10, largest_first: bool = False):
        self.num = num
        self.largest_first = largest_first

    def __call__(self, time: datetime, rdd: RDD) -> None:
        if self.largest_first:
            shown = rdd.takeOrdered(self.num + 1, key=lambda kv: (-kv[1], str(kv[0])))
        else:
            shown = rdd.take(self.num + 1)
        items = ", ".join(_show(record) for record in shown[: self.num])
        more = " ..." if len(shown) > self.num else ""
        print(f"  {time:%H:%M:%S.%f}"[:-3] + f"  {items}{more}", flush=True)


def _show(record: Any) -> str:
    if isinstance(record, tuple) and len(record) == 2:
        return f"{record[0]}={record[1]}"
    return str(record)


def console_sink(job: StreamingJob, output: int = 0) -> ConsoleSink:
    console = job.spec.sink.console
    num = console.num if console else 10
    return ConsoleSink(num, largest_first=job.spec.app.counts)
