"""Connectors: one module per source or sink, chosen by the spec's `type` through these tables.

The engine core (graph, scheduler, windows, state) never imports this package; a source is an
`InputDStream` (dstream.sources) that plans replayable ranges, a sink a `foreachRDD` function that
is idempotent per batch time. Adding one means a module here and a line in a table.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING

from pyspark import RDD

from dstream.connectors.console import console_sink
from dstream.connectors.files import files_sink, files_source
from dstream.connectors.kafka import kafka_sink, kafka_source
from dstream.connectors.nats import nats_source
from dstream.connectors.postgres import postgres_sink
from dstream.connectors.rate import rate_source
from dstream.connectors.redis import redis_source

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.sources import InputDStream
    from dstream.spec import Source, StreamingJob

Sink = Callable[[datetime, RDD], None]

SOURCES: dict[str, Callable[[StreamingContext, Source], InputDStream]] = {
    "rate": rate_source,
    "files": files_source,
    "redis": redis_source,
    "nats": nats_source,
    "kafka": kafka_source,
}

# A sink factory takes the job and the index of the app's output stream it writes: a job may
# write several streams, and a transactional sink keeps each one's commits apart.
SINKS: dict[str, Callable[[StreamingJob, int], Sink]] = {
    "files": files_sink,
    "console": console_sink,
    "postgres": postgres_sink,
    "kafka": kafka_sink,
}


def create_source(ssc: StreamingContext, source: Source) -> InputDStream:
    """The input stream that `source.type` names, configured from its block."""
    return SOURCES[source.type](ssc, source)


def create_sink(job: StreamingJob, output: int = 0) -> Sink:
    """The output function that `sink.type` names for the app's `output`-th stream."""
    return SINKS[job.spec.sink.type](job, output)
