"""`sink.type: kafka`: each batch of an output stream in one Kafka transaction, exactly once.

The sink writes each batch of an output stream in ONE Kafka transaction, from the driver, as the
PostgreSQL sink does (and for the same reason: one transaction per batch needs one producer). Its
`transactional.id` is derived from job, topic and output, so a restarted driver's producer fences
the killed one's and aborts its open transaction (`init_transactions`). Idempotence per batch:
the same transaction writes a commit record (key job/topic/output, value the batch time) into the
compacted `commitTopic`; a batch whose time is at or before the newest committed record under its
key was committed already, and writes nothing. Records and commit record commit or abort
together, so a read_committed consumer sees every batch exactly once. Why a commit topic rather
than `send_offsets_to_transaction` to a dedicated consumer group: after a broker restart,
librdkafka 2.16's send_offsets_to_transaction was seen to block past its own timeout while the
group coordinator came back (tests/connectors/test_kafka_sink.py restarts the broker), where a
record in a topic needs only the partition leader and the transaction coordinator that every
transaction needs anyway. `delivery: atLeastOnce` uses the idempotent producer without
transactions.

Fencing (runtime/fencing.py): with a checkpoint, the driver writes under an epoch, which every
message carries in the header `dstream-epoch` and the commit record in its value. Three checks
keep a deposed driver's output out. The epoch ledger is checked before `init_transactions`, so a
deposed driver does not fence its successor's producer, and again right before the commit.
Kafka fences by `transactional.id`: the successor's `init_transactions` aborts the deposed
driver's open transaction and makes its later commits fail (PRODUCER_FENCED). And the commit
records are read after every `init_transactions`: a newer epoch than the driver's raises
DeposedError. So once a driver of epoch E has committed a batch, no older driver commits again:
its producer was initialised either before E's, and E's fenced it, or after E's commit, and then
it reads E in the commit records. What remains is the time before the successor's first
`init_transactions` (its first batch): a deposed driver that passed its last ledger check may
still commit then. That is safe: the batch is one the log recorded (records are created
exclusively), so it holds the input the successor would replay; the successor's init waits for
that transaction to end, and its read of the commit records afterwards counts the batch as
committed. The bound is the PostgreSQL sink's: nothing of a deposed driver lands after its
successor's first batch.

The client settings it shares with the source are in kafka_client.py.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark import RDD

from dstream.connectors.kafka_client import REQUEST_TIMEOUT_S, client_config
from dstream.runtime.leadership.fencing import DeposedError, Fence
from dstream.runtime.timeutil import time_to_ms

if TYPE_CHECKING:
    from dstream.spec import KafkaSink as KafkaSinkSettings
    from dstream.spec import StreamingJob

log = logging.getLogger(__name__)

BATCH_TIME_HEADER = "dstream-batch-time"
EPOCH_HEADER = "dstream-epoch"
COMMIT_READ_S = 180.0  # reading the sink's commit topic: above Kafka's transaction timeouts


@dataclass(frozen=True)
class Committed:
    """What an output's commit records say: the newest batch time committed (-1: none) and the
    newest epoch that committed one (0: none, or drivers without a checkpoint, or commit records
    from before epochs)."""

    batch_ms: int = -1
    epoch: int = 0

    def after(self, commit: dict[str, Any]) -> Committed:
        """This, with one more commit record read."""
        return Committed(
            max(self.batch_ms, commit["batchTimeMs"]), max(self.epoch, commit.get("epoch", 0))
        )


def key_and_value(record: Any, key_field: str | None) -> tuple[Any, Any]:
    """A pair (k, v) is key k and value v; a dict with `key_field` is keyed by that field and
    written whole; anything else has no key."""
    if isinstance(record, tuple) and len(record) == 2:
        return record
    if key_field is not None and isinstance(record, dict):
        return record.get(key_field), record
    return None, record


def encode(value: Any, format: str) -> bytes | None:
    """A value as `format` says: JSON (what is not JSON becomes its string), or text."""
    if value is None or isinstance(value, bytes):
        return value
    if format == "text":
        return str(value).encode()
    return json.dumps(value, default=str).encode()


def encode_key(key: Any) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    return (key if isinstance(key, str) else json.dumps(key, default=str)).encode()


class KafkaSink:
    """A `foreachRDD` function writing each batch of one output stream to a topic."""

    def __init__(self, job: str, settings: KafkaSinkSettings, output: int = 0):
        self.job = job
        self.settings = settings
        self.output = output
        self.transactional_id = f"dstream-{job}-{settings.topic}-{output}"
        self.commit_key = f"{job}/{settings.topic}/{output}".encode()
        self._config = client_config(settings)
        self._producer: Producer | None = None
        self._committed: Committed | None = None  # read once per producer, after its init

    def __call__(self, time: datetime, rdd: RDD) -> None:
        """Unfenced, as the output of a context without a checkpoint."""
        self.write_batch(time, rdd, None)

    def write_batch(self, time: datetime, rdd: RDD, fence: Fence | None) -> None:
        batch_ms = time_to_ms(time)
        records = rdd.collect()
        try:
            if self.settings.delivery == "atLeastOnce":
                self.write_idempotent(batch_ms, records, fence)
            else:
                self.write_transaction(batch_ms, records, fence)
        except DeposedError:
            raise
        except Exception as error:  # not only KafkaException: a fenced producer's flush was
            # seen to raise a SystemError caused by it (confluent-kafka 2.x, from inside a
            # delivery callback)
            self.close()  # the next attempt starts over: init_transactions settles this one
            reason = error.__cause__ or error
            raise RuntimeError(f"kafka sink {self.settings.topic}: {reason}") from None

    def producer(self, transactional: bool) -> Producer:
        if self._producer is None:
            config = {**self._config, "enable.idempotence": True, "acks": "all"}
            if transactional:
                config["transactional.id"] = self.transactional_id
            self._producer = Producer(config)
            if transactional:
                self._producer.init_transactions(REQUEST_TIMEOUT_S * 3)
        return self._producer

    def close(self) -> None:
        """Drop the producer (and what it read), so the next batch starts with a new one."""
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.flush(1)
            except KafkaException as error:  # a fenced producer refuses even this
                log.info("closing the kafka producer: %s", error)
        self._committed = None

    def write_transaction(self, batch_ms: int, records: list[Any], fence: Fence | None) -> None:
        """Records and the batch's commit record in one transaction; nothing if the batch's
        commit record is there already; DeposedError if a newer driver leads (module doc)."""
        epoch = epoch_of(fence)
        if fence is not None:
            fence.check()  # before init_transactions: never fence the successor's producer
        producer = self.producer(transactional=True)  # fences a killed driver's producer first
        committed = self.committed()
        if fence is not None and committed.epoch > epoch:
            where = (
                f"the commit records of {self.commit_key.decode()} in {self.settings.commit_topic}"
            )
            raise DeposedError(epoch, committed.epoch, where)
        if batch_ms <= committed.batch_ms:
            log.info("batch %s already committed to %s", batch_ms, self.settings.topic)
            return
        producer.begin_transaction()
        try:
            self.produce_all(producer, batch_ms, records, epoch)
            commit = {"batchTimeMs": batch_ms, "records": len(records), "epoch": epoch}
            producer.produce(
                self.settings.commit_topic,
                key=self.commit_key,
                value=json.dumps(commit).encode(),
                partition=0,
            )
            if fence is not None:
                fence.check()  # the ledger's last word before the commit
            producer.commit_transaction(REQUEST_TIMEOUT_S * 3)
        except Exception:
            self.abort(producer)
            raise
        self._committed = Committed(batch_ms, max(epoch, committed.epoch))

    def write_idempotent(self, batch_ms: int, records: list[Any], fence: Fence | None) -> None:
        producer = self.producer(transactional=False)
        self.produce_all(producer, batch_ms, records, epoch_of(fence))

    def produce_all(
        self, producer: Producer, batch_ms: int, records: list[Any], epoch: int
    ) -> None:
        """Send the records and wait for every acknowledgement; KafkaException if one failed."""
        header = [
            (BATCH_TIME_HEADER, datetime.fromtimestamp(batch_ms / 1000, UTC).isoformat()),
            (EPOCH_HEADER, str(epoch)),
        ]
        failed: list[KafkaError] = []

        def delivered(error: KafkaError | None, _message: Any) -> None:
            if error is not None:
                failed.append(error)

        for record in records:
            key, value = key_and_value(record, self.settings.key_field)
            message = {
                "key": encode_key(key),
                "value": encode(value, self.settings.format),
                "headers": header,
                "on_delivery": delivered,
            }
            while True:
                try:
                    producer.produce(self.settings.topic, **message)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        left = producer.flush(REQUEST_TIMEOUT_S * 3)
        if left or failed:
            first = failed[0] if failed else KafkaError(KafkaError._TIMED_OUT, f"{left} unsent")
            raise KafkaException(first)

    def committed(self) -> Committed:
        """What this output committed so far, read once per producer, after its
        init_transactions, from the commit topic (created when missing)."""
        if self._committed is None:
            self.create_commit_topic()
            self._committed = last_commit(self._config, self.settings.commit_topic, self.commit_key)
        return self._committed

    def create_commit_topic(self) -> None:
        admin = AdminClient(self._config)
        topic = NewTopic(
            self.settings.commit_topic, num_partitions=1, config={"cleanup.policy": "compact"}
        )
        try:
            admin.create_topics([topic])[self.settings.commit_topic].result(REQUEST_TIMEOUT_S * 3)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise

    @staticmethod
    def abort(producer: Producer) -> None:
        try:
            producer.abort_transaction(REQUEST_TIMEOUT_S)
        except KafkaException as error:
            log.warning("aborting the kafka transaction failed (%s); the next one fences it", error)


def epoch_of(fence: Fence | None) -> int:
    """The epoch a driver writes under: 0 without a checkpoint (nothing to fence)."""
    return fence.epoch if fence is not None else 0


def last_commit(config: dict[str, Any], topic: str, key: bytes) -> Committed:
    """The newest batch time and epoch committed under `key` in the commit topic, read as read_committed
    up to the end the topic had when asked: the writer's own zombie transaction is aborted by
    then (init_transactions), and another writer's open one ends within its transaction timeout,
    so the wait for it is bounded."""
    consumer = Consumer(
        {
            **config,
            "group.id": "dstream-commit-reader",  # never joined nor committed: assign only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        partition = TopicPartition(topic, 0, OFFSET_BEGINNING)
        _low, end = consumer.get_watermark_offsets(partition, timeout=REQUEST_TIMEOUT_S)
        consumer.assign([partition])
        newest, deadline = Committed(), time.monotonic() + COMMIT_READ_S
        while end > 0:
            message = consumer.poll(1.0)
            if time.monotonic() > deadline:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"reading {topic}"))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and message.offset() >= end:
                    break
                if error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                continue
            if message.key() == key:
                newest = newest.after(json.loads(message.value()))
            if message.offset() + 1 >= end:
                break
        return newest
    finally:
        consumer.close()


def kafka_sink(job: StreamingJob, output: int) -> KafkaSink:
    assert job.spec.sink.kafka is not None
    return KafkaSink(job.metadata.name, job.spec.sink.kafka, output)
