"""`type: files`: new files of a directory as a source (`dstream.sources.FileInputDStream`), a
directory of JSON lines per batch as a sink."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import RDD

from dstream.runtime.checkpoint.output import save_text_atomically
from dstream.runtime.timeutil import time_to_ms
from dstream.sources import FileInputDStream, InputDStream

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source, StreamingJob


def to_json_line(record: Any) -> str:
    """One JSON document per record: pairs become {"key", "value"}, the rest as they are."""
    if isinstance(record, tuple) and len(record) == 2:
        record = {"key": record[0], "value": record[1]}
    return json.dumps(record, default=str, ensure_ascii=False)


class FilesSink:
    """`<path>/batch-<epoch-ms>/part-*` of JSON lines, with a `_SUCCESS` marker."""

    def __init__(self, path: str):
        self.path = path

    def batch_dir(self, time: datetime) -> str:
        return str(Path(self.path) / f"batch-{time_to_ms(time)}")

    def __call__(self, time: datetime, rdd: RDD) -> None:
        save_text_atomically(rdd.map(to_json_line), self.batch_dir(time))


def files_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.files is not None
    return FileInputDStream(ssc, source.files.path, source.files.format)


def files_sink(job: StreamingJob, output: int = 0) -> FilesSink:
    assert job.spec.sink.files is not None
    return FilesSink(job.spec.sink.files.path)
