"""Input streams. A source never hands the driver records: it plans an input *range* per batch
(but for socketTextStream, whose lines the driver receives: a socket has no range to replay).

`plan(time, max_records)` runs on the driver at each batch time and returns a JSON-able range
(rate: offsets per partition; files: the exact file list; redis: entry IDs per stream) that goes
into the batch log before the batch runs; `compute(time)` turns the recorded range into an RDD
whose tasks read the records. A restarted driver feeds the same recorded ranges back, so a re-run
batch reads the same input. This module holds what every source shares and the generic input streams
that StreamingContext creates itself (`queueStream`, `textFileStream`/`fileStream`,
`binaryRecordsStream`, `rateStream`, `socketTextStream`); the connectors (`dstream.connectors`)
build these, or their own brokers' streams, from a job spec's `source` block.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import RDD, Accumulator

from dstream.dstream import DStream
from dstream.runtime.checkpoint.files import write_atomically
from dstream.runtime.control import latency
from dstream.runtime.control.latency import Ages
from dstream.runtime.timeutil import datetime_of
from dstream.worker import textgen

if TYPE_CHECKING:
    from dstream.context import StreamingContext

log = logging.getLogger(__name__)


class SourceError(RuntimeError):
    """A source cannot deliver the input it must: its broker is unreachable, a stream is
    missing, or records of a planned or recorded range are gone. Running on would silently
    change the job's output, so the job stops with this message instead."""


class NotRestorableError(RuntimeError):
    """A stream of a checkpointed graph that cannot be restored from the checkpoint."""


class InputDStream(DStream):
    """A stream with no parents whose RDD for a time comes from that time's planned range."""

    def __init__(self, ssc: StreamingContext, name: str):
        super().__init__(ssc, [], ssc._graph.batch_ms)
        self.name = name
        self._ranges: dict[int, Any] = {}
        self._age_reports = latency.slice_reports(ssc.sparkContext)
        ssc._graph.add_input(self)

    def _attach(self, ssc: StreamingContext) -> None:
        """As DStream's; a stream from a checkpoint written before sources reported their
        records' ages gets the accumulator they report to."""
        super()._attach(ssc)
        if "_age_reports" not in self.__dict__:
            self._age_reports = latency.slice_reports(ssc.sparkContext)

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "name": self.name}

    def _deadletter_dir(self, time_ms: int) -> str:
        """The directory for the malformed records of the batch at time_ms (DStreamGraph's)."""
        return self._ssc._graph.deadletter_dir(time_ms)

    def plan(self, time_ms: int, max_records: int | None) -> Any:
        """Decide (and remember) the input of the batch at time_ms: at most max_records."""
        planned = self._next_range(time_ms, max_records)
        self._ranges[time_ms] = planned
        return planned

    def replay(self, time_ms: int, planned: Any) -> None:
        """Adopt a range read back from the batch log."""
        self._ranges[time_ms] = planned
        self._advance_past(planned)

    def compute(self, time_ms: int) -> RDD | None:
        if time_ms not in self._ranges:
            return None
        return self._read(time_ms, self._ranges[time_ms])

    def forget_before(self, time_ms: int) -> None:
        for t in [t for t in self._ranges if t < time_ms]:
            del self._ranges[t]

    def records_in(self, planned: Any) -> int:
        raise NotImplementedError

    def held_back(self, planned: Any, max_records: int | None) -> bool:
        """Whether the budget kept records that were available out of the range just planned
        (a range as large as its budget counts). Backpressure learns only from such batches:
        one that took everything available ran below the job's capacity."""
        return max_records is not None and self.records_in(planned) >= max_records

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        """The ages at time_ms (when each record of the batch's range became available,
        dstream.runtime.control.latency) of the batch's records; None when the source cannot tell.
        Called once per batch, when it has run."""
        return None

    def backlog(self, now_ms: int) -> int | None:
        """Records available but not yet admitted (None when the source cannot tell)."""
        return None

    def backlog_by_partition(self) -> dict[str, int]:
        """The backlog per source partition (a broker's stream), for lag per partition; {} when
        the source has one partition or cannot tell."""
        return {}

    def lost_by_partition(self) -> dict[str, int]:
        """Records this driver skipped as lost (a range removed before it was read, under
        onDataLoss: skip) per source partition; {} when none were or the source cannot lose."""
        return {}

    def position(self) -> Any:
        """Source state a restarted driver needs beyond the ranges (JSON-able)."""
        return None

    def restore_position(self, position: Any) -> None:
        """Inverse of position()."""

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        raise NotImplementedError

    def _advance_past(self, planned: Any) -> None:
        raise NotImplementedError

    def _read(self, time_ms: int, planned: Any) -> RDD:
        raise NotImplementedError


class QueueInputDStream(InputDStream):
    """queueStream: RDDs from a queue, one (or all) per batch. In memory, so not replayable.

    As in Spark, a checkpoint does not keep the queue: its RDDs would have to pass through the
    driver into the checkpoint, and could not be replayed anyway. A program reading one runs with
    a checkpoint, but getOrCreate restores it only by running its setup again (rebuild=True)."""

    _UNPICKLED = (*InputDStream._UNPICKLED, "_queue", "_default", "_planned_rdds")

    def __init__(
        self, ssc: StreamingContext, rdds: list[RDD], one_at_a_time: bool, default: RDD | None
    ):
        super().__init__(ssc, f"queue-{len(ssc._graph.inputs)}")
        self._queue = list(rdds)
        self._one_at_a_time = one_at_a_time
        self._default = default
        self._planned_rdds: dict[int, RDD] = {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        raise NotRestorableError(
            f"{self.__class__.__name__}: a queueStream's RDDs are not kept in checkpoints (as in "
            "Spark); rebuild the graph with setup (getOrCreate(path, setup, rebuild=True))"
        )

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        if self._one_at_a_time and self._queue:
            taken = [self._queue.pop(0)]
        else:
            taken, self._queue = self._queue, []
        if taken:
            rdd = taken[0] if len(taken) == 1 else self._sc.union(taken)
        else:
            rdd = self._default if self._default is not None else self._sc.emptyRDD()
        self._planned_rdds[time_ms] = rdd
        return None

    def _advance_past(self, planned: Any) -> None:
        raise RuntimeError("queueStream keeps its RDDs in memory and cannot be replayed")

    def _read(self, time_ms: int, planned: Any) -> RDD:
        return self._planned_rdds[time_ms]

    def forget_before(self, time_ms: int) -> None:
        super().forget_before(time_ms)
        for t in [t for t in self._planned_rdds if t < time_ms]:
            del self._planned_rdds[t]

    def records_in(self, planned: Any) -> int:
        return 0


def split_budget(waiting: list[int], budget: int | None) -> list[int]:
    """Share a record budget across partitions in proportion to their backlog (all if no budget)."""
    total = sum(waiting)
    if budget is None or budget >= total:
        return list(waiting)
    shares = [w * budget // total for w in waiting]
    leftover = budget - sum(shares)
    by_remainder = sorted(range(len(waiting)), key=lambda i: -(waiting[i] * budget % total))
    for i in by_remainder[:leftover]:
        shares[i] += 1
    return shares


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
        self._held_back = False  # whether the last plan left a file out for the budget
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

    def _arrival(self, name: str) -> int | None:
        """When the file arrived: its modification time (ms) as the batch that takes it first
        sees it, recorded in the batch's range so a replay measures from the same instant."""
        try:
            return (self.directory / name).stat().st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None

    def backlog(self, now_ms: int) -> int:
        return sum(self._estimate(n) for n in self._listing() if n not in self._seen)

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        chosen: list[str] = []
        admitted = 0
        listing = self._listing()
        if listing:  # an empty listing may be a directory briefly missing, not one emptied
            self._seen.intersection_update(listing)
        self._held_back = False
        for name in listing:
            if name in self._seen:
                continue
            estimate = self._estimate(name)
            if chosen and max_records is not None and admitted + estimate > max_records:
                self._held_back = True
                break
            chosen.append(name)
            admitted += estimate
        self._advance_past({"files": chosen})
        arrivals = [self._arrival(name) for name in chosen]
        return {"files": chosen, "records": admitted, "arrivals": arrivals}

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

    def held_back(self, planned: Any, max_records: int | None) -> bool:
        """Whole files are admitted, so a range may stop short of its budget because the next
        file would not fit (held back) or hold more than it (not: there was no next file)."""
        return self._held_back

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        return latency.reported_ages(self._age_reports, time_ms)

    def _read(self, time_ms: int, planned: Any) -> RDD:
        files = [str(self.directory / name) for name in planned["files"]]
        if not files:
            return self._sc.emptyRDD()
        # a batch logged before arrivals were recorded has none: its latency is unknown
        arrivals = dict(zip(files, planned.get("arrivals") or [None] * len(files), strict=True))
        reports = self._age_reports

        def report(item: tuple[str, int, int]) -> Callable[[int], None]:
            """What a range's reader calls with its record count once it read them all: every
            record of a file arrived with the file."""
            arrival = arrivals[item[0]]

            def done(count: int) -> None:
                if count and arrival is not None:
                    key = (time_ms, *item)
                    reports.add({key: {latency.age_bin(time_ms - arrival): count}})

            return done

        return self._read_files(time_ms, files, report)

    def _read_files(
        self, time_ms: int, files: list[str], report: Callable[[Any], Callable[[int], None]]
    ) -> RDD:
        """The records of the batch's files; `report(item)` is what the reader of a range
        (or a whole file) calls with its record count."""
        if self.format == "text":
            ranges = byte_ranges(files, self._sc.defaultParallelism)
            return self._sc.parallelize(ranges, len(ranges)).flatMap(
                lambda item: _lines_in_range(item, report(item))
            )
        deadletter = self._deadletter_dir(time_ms)
        malformed = self._malformed
        return self._sc.parallelize(files, len(files)).flatMap(
            lambda path: _read_json_lines(path, deadletter, malformed, report((path, 0, 0)))
        )


class BinaryRecordsInputDStream(FileInputDStream):
    """binaryRecordsStream: new files of a directory, each cut into records of `record_length`
    bytes, chosen, logged and replayed as textFileStream's files are. A file whose length is not
    a multiple of the record length would end in a record cut short: Spark fails the batch then
    (an EOFException) and pyspark.streaming goes on without the file's records; here the batch
    that would take the file is refused at planning, before anything of it is logged, with a
    SourceError naming the file, and the run stops until the file is fixed or removed."""

    def __init__(self, ssc: StreamingContext, directory: str, record_length: int):
        if not isinstance(record_length, int) or record_length <= 0:
            raise ValueError(f"recordLength must be a positive int, got {record_length!r}")
        super().__init__(
            ssc,
            directory,
            "binary",
            new_files_only=True,
            name="binaryRecordsStream",
            bytes_per_record=record_length,
        )
        self.record_length = record_length

    def signature(self) -> dict[str, Any]:
        return {**super().signature(), "recordLength": self.record_length}

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        planned = super()._next_range(time_ms, max_records)
        for name in planned["files"]:
            path = self.directory / name
            size = path.stat().st_size
            if size % self.record_length:
                raise SourceError(cut_short(str(path), size, self.record_length))
        return planned

    def _read_files(
        self, time_ms: int, files: list[str], report: Callable[[Any], Callable[[int], None]]
    ) -> RDD:
        length = self.record_length
        ranges = byte_ranges(files, self._sc.defaultParallelism, align=length)
        return self._sc.parallelize(ranges, len(ranges)).flatMap(
            lambda item: _records_in_range(item, length, report(item))
        )


def cut_short(path: str, size: int, record_length: int) -> str:
    """What is wrong with a file of binaryRecordsStream whose last record is cut short."""
    return (
        f"binaryRecordsStream: {path} has {size} bytes, not a multiple of recordLength "
        f"{record_length}: its last record would be cut short ({size % record_length} of "
        f"{record_length} bytes). Fix or remove the file (write files under a hidden name and "
        "rename them into place)"
    )


def byte_ranges(paths: list[str], cores: int, align: int = 1) -> list[tuple[str, int, int]]:
    """(path, start, end): the files cut into byte ranges of about an equal share of the
    batch's bytes per core (never under MIN_RANGE_BYTES), so that a batch of fewer large files
    than cores still keeps every core busy. The files are complete (renamed into place) and a
    line is read by the range holding its first byte, so a replayed batch reads the same lines
    however it cuts them (with another core count, say). Cuts fall on multiples of `align`: a
    fixed record length keeps each record in one range."""
    sizes = [os.path.getsize(path) for path in paths]
    share = max(MIN_RANGE_BYTES, -(-sum(sizes) // cores))
    ranges = []
    for path, size in zip(paths, sizes, strict=True):
        pieces = max(1, -(-size // share))
        cuts = [size // align * i // pieces * align for i in range(pieces)] + [size]
        ranges += [(path, cuts[i], cuts[i + 1]) for i in range(pieces)]
    return ranges


def _lines_in_range(
    path_start_end: tuple[str, int, int], done: Callable[[int], None] | None = None
) -> Iterator[str]:
    """The lines that begin in bytes [start, end) of the file, without their line ends (\\n,
    \\r\\n or \\r, as Python's text mode and Hadoop's line reader end lines). A run of lines
    ended by \\r belongs with the \\n-ended line it is part of to the range holding its first
    byte, so ranges that tile a file read each of its lines once, wherever the cuts fall.
    `done` gets the number of lines once all were read (counted here, in the loop that reads
    them, rather than by a wrapper around every line)."""
    path, start, end = path_start_end
    count = 0
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
                parts = line.split(b"\r")
                count += len(parts)
                yield from (part.decode("utf-8", errors="replace") for part in parts)
            else:
                count += 1
                yield line.decode("utf-8", errors="replace")
    if done is not None:
        done(count)


def _records_in_range(
    path_start_end: tuple[str, int, int],
    record_length: int,
    done: Callable[[int], None] | None = None,
) -> Iterator[bytes]:
    """The records of `record_length` bytes that begin in bytes [start, end) of the file
    (start a multiple of the length); SourceError for a record cut short, in a file that changed
    after its batch was planned. `done` gets the number of records once all were read."""
    path, start, end = path_start_end
    count = 0
    with open(path, "rb") as records:
        records.seek(start)
        for _ in range(start, end, record_length):
            record = records.read(record_length)
            if len(record) < record_length:
                raise SourceError(cut_short(path, os.path.getsize(path), record_length))
            count += 1
            yield record
    if done is not None:
        done(count)


def _read_json_lines(
    path: str,
    deadletter: str | None,
    counter: Accumulator[int],
    done: Callable[[int], None] | None = None,
) -> Iterator[Any]:
    """Parsed JSON lines; malformed ones are counted and go to `<deadletter>/<file>.jsonl`
    (idempotent per batch). `done` gets the number of parsed records once all were read."""
    malformed = []
    parsed = 0
    with open(path, encoding="utf-8", errors="replace") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as error:
                malformed.append(
                    {"file": path, "line": number, "error": str(error), "record": line.rstrip("\n")}
                )
            else:
                parsed += 1
                yield record
    if malformed:
        counter.add(len(malformed))
    if malformed and deadletter is not None:
        body = "".join(json.dumps(m) + "\n" for m in malformed).encode()
        write_atomically(Path(deadletter) / f"{Path(path).name}.jsonl", body)
    if done is not None:
        done(parsed)


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

    def available_at(self, partition: int, offset: int) -> int:
        """When record `offset` of `partition` became available (ms): the first millisecond
        at which _available counts it, record number offset * partitions + partition."""
        number = offset * self.partitions + partition
        return self._ssc._graph.zero_ms + -(-(number + 1) * 1000 // self.records_per_second)

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        """Exact from the range and the source's own schedule (`_available`, which a source
        with another offered rate overrides): no task counts anything."""
        slices = [(p, start, end) for p, (start, end) in enumerate(planned) if end > start]
        if not slices:
            return None

        def available_by(at_ms: int) -> int:
            """Records of the range available at or before at_ms (once per age bin)."""
            reached = self._available(at_ms)
            return sum(min(max(reached[p], start), end) - start for p, start, end in slices)

        total = sum(end - start for _p, start, end in slices)
        zero_ms = self._ssc._graph.zero_ms
        first = latency.first_time_reaching(available_by, 1, zero_ms, time_ms)
        last = latency.first_time_reaching(available_by, total, zero_ms, time_ms)
        return latency.ages_of_schedule(time_ms, first, last, available_by)

    def _read(self, time_ms: int, planned: Any) -> RDD:
        seed, size = self.seed, self.record_bytes
        slices = [(p, start, end) for p, (start, end) in enumerate(planned)]

        def generate(split: int, items: Iterator[tuple[int, int, int]]) -> Iterator[str]:
            for partition, start, end in items:
                yield from textgen.lines(seed, size, partition, start, end)

        return self._sc.parallelize(slices, len(slices)).mapPartitionsWithIndex(generate)


CONNECT_TIMEOUT_S = 2.0


class SocketInputDStream(InputDStream):
    """socketTextStream: UTF-8 lines from a TCP server, as pyspark.streaming's receiver reads
    them (a line ends at \\n, \\r\\n or \\r; the receiver reconnects after
    `spark.streaming.receiverRestartDelay`, 2 s, when the connection fails or ends). A planned
    range is `{"records": n}`.

    Sources here hand each batch a range that tasks read, and a socket has none: what it sent
    cannot be asked for again. So the receiver is a thread of the driver, started with the
    context, that buffers lines as they arrive; each batch takes the lines buffered when it is
    planned (at most its rate limit's budget; the rest wait, as backlog) and hands them to Spark
    with parallelize. A restart or a driver failure loses the lines buffered and those of
    batches not yet committed: a batch re-run from the checkpoint comes back empty (logged), as
    does a window's earlier batch recomputed after a restart. The buffer is in the driver's
    memory and unbounded: a job that falls behind grows it (set a rate limit)."""

    _UNPICKLED = (
        *InputDStream._UNPICKLED,
        "_buffer",
        "_batches",
        "_buffer_lock",
        "_receiver",
        "_connection",
        "_stopping",
    )

    def __init__(self, ssc: StreamingContext, hostname: str, port: int):
        super().__init__(ssc, "socketTextStream")
        self.hostname = hostname
        self.port = port
        self._reset()

    def _attach(self, ssc: StreamingContext) -> None:
        super()._attach(ssc)
        self._reset()

    def _reset(self) -> None:
        """This run's buffer and receiver (none yet): not checkpointed, as they hold this
        driver's lines and connection."""
        self._buffer: list[str] = []
        self._batches: dict[int, list[str]] = {}
        self._buffer_lock = threading.Lock()
        self._receiver: threading.Thread | None = None
        self._connection: socket.socket | None = None
        self._stopping = threading.Event()

    @property
    def address(self) -> str:
        return f"{self.hostname}:{self.port}"

    def start_receiving(self) -> None:
        """Connect and buffer lines from now on, warning that they can be lost."""
        log.warning(
            "socketTextStream(%s): the lines it receives are held in this driver's memory until "
            "their batch runs, and a socket cannot send them again: a restart or a driver "
            "failure loses those not yet processed (batches re-run from the checkpoint come "
            "back empty). For input that survives a restart, use a replayable source (files, "
            "Kafka, Redis, NATS).",
            self.address,
        )
        delay_s = int(self._sc._conf.get("spark.streaming.receiverRestartDelay", "2000")) / 1000
        self._receiver = threading.Thread(
            target=self._receive,
            args=(delay_s,),
            name=f"dstream-socket-{self.address}",
            daemon=True,
        )
        self._receiver.start()

    def stop_receiving(self) -> None:
        """Close the connection and end the receiver; lines not yet planned are dropped."""
        self._stopping.set()
        connection = self._connection
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._receiver is not None:
            self._receiver.join()

    def _receive(self, delay_s: float) -> None:
        """Read lines into the buffer until stopped, connecting again after a failure or the
        end of the connection, as Spark's receiver restarts."""
        while not self._stopping.is_set():
            try:
                address = (self.hostname, self.port)
                with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as conn:
                    conn.settimeout(None)
                    self._connection = conn
                    if self._stopping.is_set():
                        return
                    with conn.makefile("r", encoding="utf-8", errors="replace") as lines:
                        for line in lines:
                            with self._buffer_lock:
                                self._buffer.append(line.removesuffix("\n"))
                problem = "the server closed the connection"
            except OSError as error:
                problem = f"cannot read from it: {error}"
            finally:
                self._connection = None
            if not self._stopping.is_set():
                log.warning(
                    "socketTextStream(%s): %s; again in %.1f s", self.address, problem, delay_s
                )
                self._stopping.wait(delay_s)

    def backlog(self, now_ms: int) -> int:
        with self._buffer_lock:
            return len(self._buffer)

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        with self._buffer_lock:
            taken = len(self._buffer) if max_records is None else max_records
            lines, self._buffer = self._buffer[:taken], self._buffer[taken:]
        self._batches[time_ms] = lines
        return {"records": len(lines)}

    def _advance_past(self, planned: Any) -> None:
        """Nothing to advance: lines leave the buffer when a batch takes them."""

    def records_in(self, planned: Any) -> int:
        return int(planned["records"])

    def forget_before(self, time_ms: int) -> None:
        super().forget_before(time_ms)
        for t in [t for t in self._batches if t < time_ms]:
            del self._batches[t]

    def _read(self, time_ms: int, planned: Any) -> RDD:
        lines = self._batches.get(time_ms)
        if lines is None:
            if planned["records"]:
                log.warning(
                    "socketTextStream(%s): the %d lines of batch %s were received by an earlier "
                    "driver and are lost",
                    self.address,
                    planned["records"],
                    datetime_of(time_ms),
                )
            return self._sc.emptyRDD()
        return self._sc.parallelize(lines)
