"""`type: files`: new files of a directory as a source, a directory per batch as a sink."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import RDD, Accumulator

from dstream.runtime.checkpoint import write_atomically
from dstream.runtime.output import save_text_atomically
from dstream.runtime.timeutil import time_to_ms
from dstream.sources import InputDStream

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import Source, StreamingJob

MIN_RANGE_BYTES = 64 * 1024


class FileInputDStream(InputDStream):
    """New files in a directory, in name order (names starting with '.' or '_' are ignored).

    The source remembers every file it handed out (in the batch log), so a restart neither
    re-reads nor skips a file; files that left the directory are forgotten, which bounds that
    memory. Writers should write under a hidden name and rename into place: a file is read as it
    is when its batch runs. With format 'json', each line must be a JSON document; a malformed
    line is counted (`malformed_records`), written with its file and line number to the
    dead-letter directory, and skipped. Text files are read in byte ranges of about an equal
    share of the batch per core, so that a batch of one large file uses every core; a JSON file
    is read by one task (its dead-letter entries number its lines).
    """

    def __init__(
        self,
        ssc: StreamingContext,
        directory: str,
        format: str = "text",
        new_files_only: bool = False,
        name: str = "files",
        bytes_per_record: int = 100,
    ):
        super().__init__(ssc, name)
        self.directory = Path(directory)
        self.format = format
        self._seen: set[str] = set()
        self._bytes_per_record = bytes_per_record
        self._malformed = ssc.sparkContext.accumulator(0)
        if new_files_only:
            self._seen.update(self._listing())

    @property
    def malformed_records(self) -> int:
        """Malformed JSON lines met by this driver's batches (a re-run batch counts again)."""
        return self._malformed.value

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "format": self.format}

    def _listing(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(
            entry.name
            for entry in os.scandir(self.directory)
            if entry.is_file() and not entry.name.startswith((".", "_"))
        )

    def _estimate(self, name: str) -> int:
        try:
            size = (self.directory / name).stat().st_size
        except FileNotFoundError:
            return 0
        return max(1, size // self._bytes_per_record)

    def backlog(self, now_ms: int) -> int:
        return sum(self._estimate(n) for n in self._listing() if n not in self._seen)

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        chosen: list[str] = []
        admitted = 0
        listing = self._listing()
        if listing:  # an empty listing may be a directory briefly missing, not one emptied
            self._seen.intersection_update(listing)
        for name in listing:
            if name in self._seen:
                continue
            estimate = self._estimate(name)
            if chosen and max_records is not None and admitted + estimate > max_records:
                break
            chosen.append(name)
            admitted += estimate
        self._advance_past({"files": chosen})
        return {"files": chosen, "records": admitted}

    def _advance_past(self, planned: Any) -> None:
        self._seen.update(planned["files"])

    def position(self) -> Any:
        return {"seen": sorted(self._seen)}

    def restore_position(self, position: Any) -> None:
        """The recorded set replaces the listing taken at construction (textFileStream's files
        present at start): files that arrived while the driver was down are new, not old."""
        if position:
            self._seen = set(position["seen"])

    def records_in(self, planned: Any) -> int:
        return int(planned.get("records", 0))

    def _read(self, time_ms: int, planned: Any) -> RDD:
        files = [str(self.directory / name) for name in planned["files"]]
        if not files:
            return self._sc.emptyRDD()
        if self.format == "text":
            ranges = byte_ranges(files, self._sc.defaultParallelism)
            return self._sc.parallelize(ranges, len(ranges)).flatMap(_lines_in_range)
        deadletter = self._ssc._graph.deadletter_dir(time_ms)
        malformed = self._malformed
        return self._sc.parallelize(files, len(files)).flatMap(
            lambda path: _read_json_lines(path, deadletter, malformed)
        )


def byte_ranges(paths: list[str], cores: int) -> list[tuple[str, int, int]]:
    """(path, start, end): the files cut into byte ranges of about an equal share of the
    batch's bytes per core (never under MIN_RANGE_BYTES), so that a batch of fewer large files
    than cores still keeps every core busy. The files are complete (renamed into place) and a
    line is read by the range holding its first byte, so a replayed batch reads the same lines
    however it cuts them (with another core count, say)."""
    sizes = [os.path.getsize(path) for path in paths]
    share = max(MIN_RANGE_BYTES, -(-sum(sizes) // cores))
    ranges = []
    for path, size in zip(paths, sizes, strict=True):
        pieces = max(1, -(-size // share))
        cuts = [size * i // pieces for i in range(pieces + 1)]
        ranges += [(path, cuts[i], cuts[i + 1]) for i in range(pieces)]
    return ranges


def _lines_in_range(path_start_end: tuple[str, int, int]) -> Iterator[str]:
    """The lines that begin in bytes [start, end) of the file, without their line ends (\\n,
    \\r\\n or \\r, as Python's text mode and Hadoop's line reader end lines). A run of lines
    ended by \\r belongs with the \\n-ended line it is part of to the range holding its first
    byte, so ranges that tile a file read each of its lines once, wherever the cuts fall."""
    path, start, end = path_start_end
    with open(path, "rb") as lines:
        if start:
            lines.seek(start - 1)
            lines.readline()  # the rest of a line that began before start
        position = lines.tell()
        for line in lines:
            if position >= end:
                break
            position += len(line)
            line = line.removesuffix(b"\n").removesuffix(b"\r")
            if b"\r" in line:
                yield from (part.decode("utf-8", errors="replace") for part in line.split(b"\r"))
            else:
                yield line.decode("utf-8", errors="replace")


def _read_json_lines(path: str, deadletter: str | None, counter: Accumulator[int]) -> Iterator[Any]:
    """Parsed JSON lines; malformed ones are counted and go to `<deadletter>/<file>.jsonl`
    (idempotent per batch)."""
    malformed = []
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError as error:
                malformed.append(
                    {"file": path, "line": number, "error": str(error), "record": line.rstrip("\n")}
                )
    if malformed:
        counter.add(len(malformed))
    if malformed and deadletter is not None:
        body = "".join(json.dumps(m) + "\n" for m in malformed).encode()
        write_atomically(Path(deadletter) / f"{Path(path).name}.jsonl", body)


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
