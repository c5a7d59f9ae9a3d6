"""`source.type: rate`: deterministic generated text, the source for demos and benchmarks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dstream.sources import InputDStream, RateInputDStream

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source


def rate_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.rate is not None
    rate = source.rate
    return RateInputDStream(
        ssc, rate.records_per_second, rate.partitions, rate.seed, rate.record_bytes
    )
