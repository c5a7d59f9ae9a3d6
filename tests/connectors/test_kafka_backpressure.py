"""Backpressure on a Kafka source that goes quiet and then gets a burst, on the wall clock.

Spark's law reads every batch as a measure of the job's capacity, so a quiet topic's small
batches pull the rate limit down to about their own rate, and a burst then waits while the limit
doubles back up batch by batch. A batch that admitted everything available says nothing about
capacity (runtime/control/backpressure.py): the burst must meet the limit the job had.
"""

from __future__ import annotations

import math
import statistics
import time
import uuid

import pytest
from conditions import eventually
from dstream import StreamingContext
from dstream.connectors.kafka_source import KafkaInputDStream
from dstream.runtime.control.backpressure import PIDRateEstimator, RateController
from dstream.runtime.scheduling.batch import BatchInfo
from dstream.runtime.scheduling.clock import ManualClock
from dstream.spec import KafkaSource
from kafka_server import produce
from streams import BATCH_TIMEOUT_S

pytestmark = [pytest.mark.slow, pytest.mark.solo, pytest.mark.timeout(600)]

INITIAL_RATE = 2000  # records/s, the limit before the quiet spell
QUIET_PER_BATCH = 20  # records a batch while the topic is quiet
QUIET_BATCHES = 8  # Spark's law halves the limit every one of them, down to minRate
BURST_INTERVALS = 4  # the burst holds this many intervals' worth at INITIAL_RATE
SPARE_BATCHES = 2


def kafka_stream(ssc: StreamingContext, bootstrap: str, topic: str) -> KafkaInputDStream:
    settings = KafkaSource.model_validate({"bootstrapServers": bootstrap, "topics": [topic]})
    return KafkaInputDStream(ssc, settings, retry_seconds=20)


def new_topic(kafka_server) -> str:
    name = f"burst-{uuid.uuid4().hex[:8]}"
    kafka_server.create_topic(name, 2)
    return name


@pytest.fixture(scope="module")
def batch_s(sc, kafka_server) -> float:
    """An interval at least 3x what a near-empty batch of this job costs here (a loaded machine
    gets a longer one): a batch that overran for the machine's sake would be measured."""
    topic = new_topic(kafka_server)
    ssc = StreamingContext(sc, 1, clock=ManualClock())
    kafka_stream(ssc, kafka_server.bootstrap, topic).count().foreachRDD(lambda rdd: rdd.collect())
    ssc.start()
    costs = []
    try:
        for _ in range(4):
            produce(kafka_server.bootstrap, topic, ["warm"] * QUIET_PER_BATCH)
            started = time.perf_counter()
            ssc._clock.advance(ssc._batch_ms)
            ssc._scheduler.wait_for_batch(ssc._clock.now_ms(), BATCH_TIMEOUT_S)
            costs.append(time.perf_counter() - started)
    finally:
        ssc.stop(stopSparkContext=False)
    return float(min(4, max(1, math.ceil(3 * statistics.median(costs[1:])))))


def limit_of(batch: BatchInfo) -> float:
    return next(iter(batch.rate_limits.values())) or math.inf


def timeline(batches: list[BatchInfo], batch_s: float) -> str:
    return f"interval {batch_s} s:\n" + "\n".join(
        f"  limit {limit_of(b):>8,.0f}/s  records {b.numRecords():>6,}  processing "
        f"{b.processingDelay() / 1000:5.2f} s  delay {b.schedulingDelay() / 1000:5.2f} s"
        for b in batches
    )


def test_a_burst_after_a_quiet_spell_meets_the_limit_the_job_had(
    sc, kafka_server, monkeypatch, batch_s
):
    topic = new_topic(kafka_server)
    ssc = StreamingContext(sc, batch_s)
    source = kafka_stream(ssc, kafka_server.bootstrap, topic)
    counted: list[int] = []
    source.count().foreachRDD(lambda rdd: counted.extend(rdd.collect()))
    controller = RateController(PIDRateEstimator(round(batch_s * 1000)), initial_rate=INITIAL_RATE)
    # The session SparkContext has backpressure off in its conf: give this context the
    # controller its conf would build, without touching the shared conf.
    monkeypatch.setattr(ssc, "_rate_controllers", lambda: {source.name: controller})
    burst = round(BURST_INTERVALS * INITIAL_RATE * batch_s)
    ssc.start()
    try:
        for produced in range(1, QUIET_BATCHES + 1):
            produce(kafka_server.bootstrap, topic, ["quiet"] * QUIET_PER_BATCH)
            eventually(
                lambda n=produced: sum(counted) == n * QUIET_PER_BATCH,
                BATCH_TIMEOUT_S,
                message="a quiet batch admitted",
            )
        quiet = list(ssc._scheduler.history)
        produce(kafka_server.bootstrap, topic, ["burst"] * burst)
        total = QUIET_BATCHES * QUIET_PER_BATCH + burst
        eventually(lambda: sum(counted) >= total, 40 * batch_s + 120, message="the burst admitted")
    finally:
        ssc.stop(stopSparkContext=False)
    history = list(ssc._scheduler.history)
    shown = timeline(history, batch_s)
    assert sum(counted) == total, shown  # every record once
    assert all(limit_of(b) == INITIAL_RATE for b in quiet), shown  # not dragged down
    bursting = [b for b in history[len(quiet) :] if b.numRecords()]
    assert limit_of(bursting[0]) >= INITIAL_RATE, shown
    assert len(bursting) <= BURST_INTERVALS + SPARE_BATCHES, shown
