"""Connectors: one module per source or sink, chosen by the spec's `type` through these tables.

A table maps a type to `module:factory`, imported on first use: a job that reads files never
loads the Redis, NATS or PostgreSQL clients. A source is an `InputDStream` (dstream.sources) that
plans replayable ranges, a sink a `foreachRDD` function that is idempotent per batch time.
Adding one means a module here and a line in a table.

Layer: above the public API (dstream.context, dstream.sources, ...) and the runtime, which never
import this package; below the job service (dstream.service) and the HTTP API (dstream_api).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import RDD

    from dstream.context import StreamingContext
    from dstream.sources import InputDStream
    from dstream.spec import Source, StreamingJob

Sink = Callable[[datetime, "RDD"], None]

# type -> "module:factory"; a source factory takes (ssc, source) and returns an InputDStream.
SOURCES: dict[str, str] = {
    "rate": "dstream.connectors.rate:rate_source",
    "files": "dstream.connectors.files:files_source",
    "redis": "dstream.connectors.redis:redis_source",
    "nats": "dstream.connectors.nats:nats_source",
    "kafka": "dstream.connectors.kafka_source:kafka_source",
}

# A sink factory takes the job and the index of the app's output stream it writes: a job may
# write several streams, and a transactional sink keeps each one's commits apart.
SINKS: dict[str, str] = {
    "files": "dstream.connectors.files:files_sink",
    "console": "dstream.connectors.console:console_sink",
    "postgres": "dstream.connectors.postgres:postgres_sink",
    "kafka": "dstream.connectors.kafka_sink:kafka_sink",
}


def factory(table: dict[str, str], type_: str) -> Callable[..., Any]:
    """The factory a table names for `type_`, its module imported now."""
    module, _, name = table[type_].partition(":")
    return getattr(importlib.import_module(module), name)


def create_source(ssc: StreamingContext, source: Source) -> InputDStream:
    """The input stream that `source.type` names, configured from its block."""
    return factory(SOURCES, source.type)(ssc, source)


def create_sink(job: StreamingJob, output: int = 0) -> Sink:
    """The output function that `sink.type` names for the app's `output`-th stream."""
    return factory(SINKS, job.spec.sink.type)(job, output)
