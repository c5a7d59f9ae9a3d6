"""`source.type: kafka`: Apache Kafka in, each batch an exact, replayable set of offset ranges.

The source is direct, in the D-Stream sense: each batch's input is a set of offset ranges
`[from, until)` per topic-partition, planned on the driver when the batch starts and written to
the batch log before any task runs. A task reads exactly its range with assign + seek (no
consumer-group membership, no rebalancing), in bounded chunks; a restarted driver feeds the same
ranges back, so it reads the same records. Planning asks the broker for each partition's log
start and end in one ListOffsets request: under `read_committed` the end is the last stable
offset (LSO), so a range never reaches into a transaction still open, and the records of aborted
transactions and the transaction markers, which a read_committed consumer never sees, leave gaps
that a task steps over (it stops at the first offset at or past `until`, or at the partition's
end). The batch's share of the rate budget is split over partitions by their lag.

Data loss is never silent: a range whose start retention or deletion removed before it was read
stops the job naming topic, partition and range (`onDataLoss: fail`, Structured Streaming's
failOnDataLoss=true), or is counted, logged and recorded in the batch log (`skip`). After each
committed batch the offsets it reached are committed to the consumer group `groupId`, so lag
tools see the job; recovery never reads them back (the batch log is the truth).

The client settings and errors it shares with the sink are in kafka_client.py.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from pyspark import RDD, Accumulator

from dstream.connectors.kafka_client import (
    REQUEST_TIMEOUT_S,
    LoginWatch,
    broker_error,
    client_config,
)
from dstream.runtime.checkpoint.files import write_atomically
from dstream.runtime.control import latency
from dstream.runtime.control.latency import Ages
from dstream.sources import InputDStream, SourceError, split_budget
from dstream.spec import starting_offsets

if TYPE_CHECKING:
    from dstream.context import StreamingContext
    from dstream.spec import KafkaSource as KafkaSourceSettings
    from dstream.spec import Source

log = logging.getLogger(__name__)

READ_CHUNK = 5_000  # messages per consume() call in a task: bounds its memory, not its range
QUEUED_KBYTES = 16_384  # librdkafka's prefetch queue per task (its default is 64 MB)
EARLIEST, LATEST = -2, -1  # Structured Streaming's codes in per-partition startingOffsets

Partition = tuple[str, int]


def partition_name(partition: Partition) -> str:
    return f"{partition[0]}-{partition[1]}"


class KafkaInputDStream(InputDStream):
    """Records of the matching topics' partitions. A planned range is `{"slices": [[topic,
    partition, from, until], ...], "next": {topic: {partition: offset}}, "lost": [[topic,
    partition, from, until], ...]}`: `next` is every known partition's position once the batch
    is admitted, so the batch log alone tells a restarted driver where to go on; `lost` are the
    ranges skipped under onDataLoss: skip."""

    # This run's clients: not checkpointed; a restored graph opens its own (_attach).
    _UNPICKLED = (*InputDStream._UNPICKLED, "_admin", "_group", "_watch")

    def __init__(
        self,
        ssc: StreamingContext,
        settings: KafkaSourceSettings,
        name: str = "kafka",
        retry_seconds: float = 60.0,
    ):
        super().__init__(ssc, name)
        self.settings = settings
        self.retry_seconds = retry_seconds
        self.group_id = settings.group_id or ssc.sparkContext.appName
        self._pattern = re.compile(settings.topic_pattern) if settings.topic_pattern else None
        self._positions: dict[Partition, int] = {}
        self._malformed = ssc.sparkContext.accumulator(0)
        self._lost: Counter[str] = Counter()  # records skipped per topic-partition
        self._connect()
        # at start, one attempt: a job pointed at the wrong servers should say so at once
        self._starts = self._starting_positions(self._partitions(patience=0, at_start=True), 0)
        ssc.addStreamingListener(self)

    # -- connections ----------------------------------------------------------------------

    def _connect(self) -> None:
        self._connect_admin()
        self._group: Consumer | None = None

    def _connect_admin(self) -> None:
        self._watch = LoginWatch()
        self._admin = AdminClient({**client_config(self.settings), "error_cb": self._watch})

    def _attach(self, ssc: StreamingContext) -> None:
        super()._attach(ssc)
        self._connect()
        ssc.addStreamingListener(self)

    def _request(self, call: Any, patience: float) -> Any:
        """A broker request on the driver, asked again (a broker restarting, a leader moving)
        for up to `patience` seconds; then, or at once for a refused login, a SourceError."""
        deadline = time.monotonic() + patience
        while True:
            try:
                return call()
            except KafkaException as error:
                self._admin.poll(0)  # serves the error callback, which may know the cause
                if self._watch.refused is not None or time.monotonic() > deadline:
                    raise broker_error(
                        self.settings.bootstrap_servers, error, self._watch
                    ) from None
            time.sleep(0.5)
            # a new client: after a broker restart the old one's cached leader epochs were
            # seen refused (FENCED_LEADER_EPOCH) for as long as it was asked
            self._connect_admin()

    @property
    def malformed_records(self) -> int:
        """Records this driver's batches could not decode (a re-run batch counts again)."""
        return self._malformed.value

    def signature(self) -> dict[str, Any]:
        topics = self.settings.topics or self.settings.topic_pattern
        return {**super().signature(), "topics": topics}

    # -- partitions and offsets -----------------------------------------------------------

    def _partitions(self, patience: float, at_start: bool = False) -> list[Partition]:
        """Every partition of the source's topics now (new ones included)."""
        metadata = self._request(
            lambda: self._admin.list_topics(timeout=REQUEST_TIMEOUT_S), patience
        )
        found: list[Partition] = []
        if self._pattern is not None:
            names = [n for n in metadata.topics if self._pattern.fullmatch(n)]
        else:
            names = list(self.settings.topics or [])
        for name in sorted(names):
            topic = metadata.topics.get(name)
            if topic is None or topic.error is not None:
                raise SourceError(self._missing_topic(name, at_start))
            found += [(name, p) for p in sorted(topic.partitions)]
        return found

    def _missing_topic(self, name: str, at_start: bool) -> str:
        servers = self.settings.bootstrap_servers
        if at_start:
            return (
                f"kafka topic {name!r} does not exist at {servers} (create it, e.g. "
                f"kafka-topics.sh --create --topic {name}, before starting the job)"
            )
        return f"kafka topic {name!r} was deleted at {servers} while the job read it"

    def _offsets(
        self, partitions: list[Partition], spec: Any, patience: float
    ) -> dict[Partition, int]:
        """One ListOffsets request: the offset `spec` names for each partition."""
        if not partitions:
            return {}
        level = (
            IsolationLevel.READ_COMMITTED
            if self.settings.isolation == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        wanted = {TopicPartition(t, p): spec for t, p in partitions}

        def ask() -> dict[Partition, int]:
            futures = self._admin.list_offsets(
                wanted, isolation_level=level, request_timeout=REQUEST_TIMEOUT_S
            )
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

        return self._request(ask, patience)

    def _bounds(
        self, partitions: list[Partition], patience: float
    ) -> dict[Partition, tuple[int, int]]:
        """(log start, end) per partition; the end is the LSO under read_committed."""
        starts = self._offsets(partitions, OffsetSpec.earliest(), patience)
        ends = self._offsets(partitions, OffsetSpec.latest(), patience)
        return {p: (starts[p], ends[p]) for p in partitions}

    def _starting_positions(
        self, partitions: list[Partition], patience: float
    ) -> dict[Partition, int]:
        """Where a job without a checkpoint starts, as startingOffsets says."""
        starting = starting_offsets(self.settings.starting_offsets)
        bounds = self._bounds(partitions, patience)
        if starting == "earliest":
            return {p: bounds[p][0] for p in partitions}
        if starting == "latest":
            return {p: bounds[p][1] for p in partitions}
        if isinstance(starting, datetime):
            ms = int(starting.timestamp() * 1000)
            found = self._offsets(partitions, OffsetSpec.for_timestamp(ms), patience)
            return {p: found[p] if found[p] >= 0 else bounds[p][1] for p in partitions}
        chosen = {}
        for partition in partitions:
            offset = starting.get(partition[0], {}).get(partition[1], EARLIEST)
            codes = {EARLIEST: bounds[partition][0], LATEST: bounds[partition][1]}
            chosen[partition] = codes.get(offset, offset)
        return chosen

    def _position(self, partition: Partition, bounds: tuple[int, int]) -> int:
        """Where a partition's next batch starts; a partition that appeared after the start
        (added to a topic, or a new topic matching the pattern) is read from its beginning."""
        if partition in self._positions:
            return self._positions[partition]
        return self._starts.get(partition, bounds[0])

    def lost_by_partition(self) -> dict[str, int]:
        return dict(self._lost)

    def backlog_by_partition(self) -> dict[str, int]:
        try:  # a metrics scrape must not wait out a broker restart
            partitions = self._partitions(patience=0)
            bounds = self._bounds(partitions, patience=0)
        except SourceError:
            return {}
        return {
            partition_name(p): max(0, bounds[p][1] - self._position(p, bounds[p]))
            for p in partitions
        }

    def backlog(self, now_ms: int) -> int | None:
        by_partition = self.backlog_by_partition()
        return sum(by_partition.values()) if by_partition else None

    # -- planning -------------------------------------------------------------------------

    def _next_range(self, time_ms: int, max_records: int | None) -> Any:
        partitions = self._partitions(self.retry_seconds)
        bounds = self._bounds(partitions, self.retry_seconds)
        self._check_vanished(partitions)
        lost, froms = [], {}
        for partition in partitions:
            start = bounds[partition][0]
            froms[partition] = self._position(partition, bounds[partition])
            if froms[partition] < start:
                lost.append([*partition, froms[partition], start])
                froms[partition] = start
        self._handle_loss(lost, "was removed (retention or deletion) before this job read it")
        waiting = [max(0, bounds[p][1] - froms[p]) for p in partitions]
        cap = self.settings.max_records_per_partition
        if cap is not None:
            waiting = [min(w, cap) for w in waiting]
        shares = split_budget(waiting, max_records)
        ranges = [
            (p, froms[p], froms[p] + share)
            for p, share in zip(partitions, shares, strict=True)
            if share > 0
        ]
        planned = {
            "slices": slices_of(ranges, self.settings.min_partitions),
            "next": nested({p: froms[p] + s for p, s in zip(partitions, shares, strict=True)}),
            "lost": lost,
        }
        self._advance_past(planned)
        return planned

    def _check_vanished(self, partitions: list[Partition]) -> None:
        """A partition this job has read that no longer exists: its topic was deleted."""
        gone = sorted(set(self._positions) - set(partitions))
        if gone:
            topics = sorted({t for t, _p in gone})
            self._handle_loss(
                [[t, p, self._positions[(t, p)], self._positions[(t, p)]] for t, p in gone],
                f"is gone: topic {', '.join(topics)} was deleted",
            )
            for partition in gone:
                del self._positions[partition]

    def _handle_loss(self, lost: list[list[Any]], why: str) -> None:
        """onDataLoss: fail stops the job naming each range; skip counts and logs them."""
        if not lost:
            return
        described = "; ".join(f"{t}-{p} offsets [{a}, {b})" for t, p, a, b in lost)
        if self.settings.on_data_loss == "fail":
            raise SourceError(
                f"kafka data loss: {described} {why}; the job stops rather than skip input "
                "(raise the topic's retention, or set onDataLoss: skip to count and skip it)"
            )
        for topic, partition, start, until in lost:
            self._lost[partition_name((topic, partition))] += until - start
        log.warning("kafka data loss skipped (onDataLoss: skip): %s %s", described, why)

    def _advance_past(self, planned: Any) -> None:
        for topic, offsets in planned["next"].items():
            for partition, offset in offsets.items():
                key = (topic, int(partition))
                self._positions[key] = max(offset, self._positions.get(key, offset))

    def replay(self, time_ms: int, planned: Any) -> None:
        """Adopt a recorded range, after checking that the broker still holds its start."""
        recorded = sorted({(t, p) for t, p, _a, _b in planned["slices"]})
        existing = set(self._partitions(self.retry_seconds))
        missing = [p for p in recorded if p not in existing]
        if missing:
            self._handle_loss(
                [s for s in planned["slices"] if (s[0], s[1]) in missing],
                "is gone: its topic or partition was deleted",
            )
        bounds = self._bounds([p for p in recorded if p in existing], self.retry_seconds)
        self._handle_loss(
            [
                [t, p, a, min(b, bounds[(t, p)][0])]
                for t, p, a, b in planned["slices"]
                if (t, p) in bounds and a < bounds[(t, p)][0] and a < b
            ],
            "of a recorded batch was removed (retention or deletion) before it was read, so "
            "the batch cannot be replayed exactly",
        )
        super().replay(time_ms, planned)

    def records_in(self, planned: Any) -> int:
        """Offsets admitted (an upper bound of records: markers and aborted records count)."""
        return sum(b - a for _t, _p, a, b in planned["slices"])

    # -- reading --------------------------------------------------------------------------

    def _read(self, time_ms: int, planned: Any) -> RDD:
        slices = [tuple(s) for s in planned["slices"]]
        if not slices:
            return self._sc.emptyRDD()
        reader = RangeReader(
            self.settings,
            self._deadletter_dir(time_ms),
            self._malformed,
            self.retry_seconds,
        )
        reports = self._age_reports

        def read(split: int, tasks: Iterator[tuple[str, int, int, int]]) -> Iterator[Any]:
            ages: Ages = {}
            records = (record for task in tasks for record in reader.read(task, ages, time_ms))
            return latency.reporting(records, reports, (time_ms, split), ages)

        return self._sc.parallelize(slices, len(slices)).mapPartitionsWithIndex(read)

    def record_ages(self, time_ms: int, planned: Any) -> Ages | None:
        """Counted by the tasks from each record's Kafka timestamp: the producer's (CreateTime)
        or, on a topic with `message.timestamp.type=LogAppendTime`, the broker's."""
        return latency.reported_ages(self._age_reports, time_ms)

    # -- the consumer group, for lag tools ------------------------------------------------

    def onBatchCompleted(self, event: Any) -> None:
        """After a committed batch, commit the offsets it reached to the consumer group (for
        lag tools only: a failure is logged, and recovery never reads them)."""
        info = event.batchInfo()
        planned = info.ranges.get(self.name)
        if planned is None or (info.error is not None and not info.skipped):
            return
        offsets = [
            TopicPartition(topic, int(partition), offset)
            for topic, by_partition in planned["next"].items()
            for partition, offset in by_partition.items()
        ]
        try:
            if self._group is None:
                config = {**client_config(self.settings), "group.id": self.group_id}
                self._group = Consumer({**config, "enable.auto.commit": False})
            self._group.commit(offsets=offsets, asynchronous=True)
        except KafkaException as error:
            log.warning("committing offsets to consumer group %s failed: %s", self.group_id, error)


def nested(offsets: dict[Partition, int]) -> dict[str, dict[str, int]]:
    """{(topic, partition): offset} as JSON-able {topic: {"partition": offset}}."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in offsets.items():
        out.setdefault(topic, {})[str(partition)] = offset
    return out


def slices_of(
    ranges: list[tuple[Partition, int, int]], min_partitions: int | None
) -> list[list[Any]]:
    """One task per partition's range; with minPartitions, ranges are cut (the longest into
    the most pieces, in proportion to their size) until there are at least that many tasks."""
    total = sum(until - start for _p, start, until in ranges)
    slices = []
    for (topic, partition), start, until in ranges:
        pieces = 1
        if min_partitions and len(ranges) < min_partitions:
            pieces = max(1, min(until - start, -(-(until - start) * min_partitions // total)))
        step = -(-(until - start) // pieces)
        slices += [[topic, partition, a, min(until, a + step)] for a in range(start, until, step)]
    return slices


class RangeReader:
    """What a task needs to read one slice: connection settings (not the password, which the
    executor's environment holds), where undecodable records go, and how long to ride out an
    unreachable broker."""

    def __init__(
        self,
        settings: KafkaSourceSettings,
        deadletter: str,
        malformed: Accumulator[int],
        retry_seconds: float,
    ):
        self.settings = settings
        self.deadletter = deadletter
        self.malformed = malformed
        self.retry_seconds = retry_seconds

    def consumer(self) -> Consumer:
        skip = self.settings.on_data_loss == "skip"
        return Consumer(
            {
                **client_config(self.settings),
                "group.id": "dstream-range-reader",  # never joined nor committed: assign only
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "isolation.level": self.settings.isolation,
                "auto.offset.reset": "earliest" if skip else "error",
                "queued.max.messages.kbytes": QUEUED_KBYTES,
            }
        )

    def read(
        self, task: tuple[str, int, int, int], ages: Ages | None = None, batch_ms: int = 0
    ) -> Iterator[Any]:
        """The records of offsets [start, until) of one partition (a task); with `ages`, each
        record's age at batch_ms (from its Kafka timestamp) is counted into it."""
        topic, partition, start, until = task
        undecodable: list[dict[str, Any]] = []
        consumer = self.consumer()
        try:
            consumer.assign([TopicPartition(topic, partition, start)])
            for message in self.messages(consumer, topic, partition, start, until):
                record, problem = decode(message.value(), self.settings.format)
                if problem is None:
                    kind, stamp_ms = message.timestamp()
                    if ages is not None and kind != TIMESTAMP_NOT_AVAILABLE:
                        latency.add_age(ages, batch_ms - stamp_ms)
                    yield record
                else:
                    undecodable.append(
                        {
                            "topic": topic,
                            "partition": partition,
                            "offset": message.offset(),
                            "error": problem,
                            "record": (message.value() or b"").decode("utf-8", "replace"),
                        }
                    )
        finally:
            consumer.close()
        if undecodable:
            self.set_aside(topic, partition, start, undecodable)

    def messages(
        self, consumer: Consumer, topic: str, partition: int, start: int, until: int
    ) -> Iterator[Any]:
        """Messages of the range in chunks; done at the first offset at or past `until`, or at
        the partition's end (read_committed: the offsets left are markers or aborted records)."""
        idle_since = time.monotonic()
        position = start
        while position < until:
            # consume waits for all num_messages or the timeout: asking for more than the
            # range holds would wait out the timeout at the end of every range
            chunk = consumer.consume(num_messages=min(READ_CHUNK, until - position), timeout=1.0)
            if not chunk and time.monotonic() - idle_since > self.retry_seconds:
                raise SourceError(
                    f"kafka {self.settings.bootstrap_servers}: nothing read from {topic}-"
                    f"{partition} at offset {position} for {self.retry_seconds:.0f} s "
                    f"(range [{start}, {until})); the broker is unreachable or the partition "
                    "lost its leader"
                )
            for message in chunk:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    if error.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise SourceError(
                            f"kafka data loss: {topic}-{partition} offsets [{start}, {until}) of "
                            f"a recorded batch were removed (retention or deletion) before they "
                            f"were read ({error.str()}); the batch cannot be replayed exactly, "
                            "so the job stops (or set onDataLoss: skip)"
                        )
                    if error.fatal():
                        raise SourceError(f"kafka {topic}-{partition}: {error.str()}")
                    continue  # transient (a broker restarting): librdkafka retries
                if message.offset() >= until:
                    return
                position = message.offset() + 1
                idle_since = time.monotonic()
                yield message

    def set_aside(self, topic: str, partition: int, start: int, bad: list[dict]) -> None:
        """Count undecodable records and write them to the batch's dead-letter directory."""
        self.malformed.add(len(bad))
        body = "".join(json.dumps(b) + "\n" for b in bad).encode()
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", f"kafka-{topic}-{partition}-{start}")
        write_atomically(Path(self.deadletter) / f"{name}.jsonl", body)


def decode(value: bytes | None, format: str) -> tuple[Any, str | None]:
    """(record, None), or (None, why) for a value this format cannot decode."""
    if value is None:
        return None, "no value (a tombstone)"
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, f"not UTF-8: {error}"
    if format == "text":
        return text, None
    try:
        return json.loads(text), None
    except ValueError as error:
        return None, f"not JSON: {error}"


def kafka_source(ssc: StreamingContext, source: Source) -> InputDStream:
    assert source.kafka is not None
    return KafkaInputDStream(ssc, source.kafka)
