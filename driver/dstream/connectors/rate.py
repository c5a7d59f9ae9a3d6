"""`source.type: rate`: deterministic generated text, the source for demos and benchmarks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from dstream.sources import InputDStream, split_budget
from dstream.worker import textgen

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source


class RateInputDStream(InputDStream):
    """Deterministic text lines arriving at records_per_second, spread over partitions.

    Records are addressed by (partition, offset); offset n of a partition becomes available at
    zero time + n * partitions / rate, so the input is a pure function of time and replays exactly.
    """

    def __init__(
        self,
        ssc: StreamingContext,
        records_per_second: int,
        partitions: int = 2,
        seed: int = 0,
        record_bytes: int = 100,
        name: str = "rate",
    ):
        super().__init__(ssc, name)
        self.records_per_second = records_per_second
        self.partitions = partitions
        self.seed = seed
        self.record_bytes = record_bytes
        self._next = [0] * partitions

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "partitions": self.partitions, "seed": self.seed}

    def _available(self, time_ms: int) -> list[int]:
        elapsed = max(0, time_ms - self._ssc._graph.zero_ms)
        total = self.records_per_second * elapsed // 1000
        base, extra = divmod(total, self.partitions)
        return [base + (1 if p < extra else 0) for p in range(self.partitions)]

    def backlog(self, now_ms: int) -> int:
        return sum(max(0, a - n) for a, n in zip(self._available(now_ms), self._next, strict=True))

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        waiting = [max(0, a - n) for a, n in zip(self._available(time_ms), self._next, strict=True)]
        admitted = split_budget(waiting, max_records)
        planned = [[n, n + k] for n, k in zip(self._next, admitted, strict=True)]
        self._advance_past(planned)
        return planned

    def _advance_past(self, planned: Any) -> None:
        self._next = [max(n, end) for n, (_start, end) in zip(self._next, planned, strict=True)]

    def records_in(self, planned: Any) -> int:
        return sum(end - start for start, end in planned)

    def _read(self, time_ms: int, planned: Any) -> RDD:
        seed, size = self.seed, self.record_bytes
        slices = [(p, start, end) for p, (start, end) in enumerate(planned)]

        def generate(split: int, items: Iterator[tuple[int, int, int]]) -> Iterator[str]:
            for partition, start, end in items:
                yield from textgen.lines(seed, size, partition, start, end)

        return self._sc.parallelize(slices, len(slices)).mapPartitionsWithIndex(generate)


def rate_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.rate is not None
    rate = source.rate
    return RateInputDStream(
        ssc, rate.records_per_second, rate.partitions, rate.seed, rate.record_bytes
    )
