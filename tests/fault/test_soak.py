"""The soak: a stateful job on `local-cluster[2,1,1024]` fed by input that arrives from outside
throughout, under a seeded schedule of driver kills, executor JVM kills and a sink outage; its
whole output checked at the end, exactly, against the input itself.

The job is faultapp: a windowed WordCount with an inverse reduce plus `updateStateByKey` running
totals. A feed says where its input comes from and where its output goes (SOAK_FEEDS picks them):
- `files`: a writer drops a file of lines into the files source's directory every 3 s; the
  files sink's outage is its directory replaced by a regular file;
- `redis`: a producer XADDs lines to two Redis streams four times a second (source.type redis);
  the output goes to PostgreSQL (sink.type postgres, mode append: a row per record and batch),
  whose outage is the server stopped and started again;
- `kafka`: a producer writes lines to a Kafka topic of two partitions four times a second
  (source.type kafka), the output goes to another topic through the exactly-once Kafka sink;
  the outage is the broker (source and sink) stopped and started again.

Each driver run is `dstream run` on the same checkpoint. A run dies by SIGKILL of its process
group at a random moment (as a lost pod), or at an exact spot through DSTREAM_FAULT_INJECT:
between a batch's outputs and its commit, while a commit or a batch record is being written.
A feed named with `+standby` (`files+standby`) runs each driver with a hot standby beside it
(`dstream run --standby`, started with the run): a kill at a random moment waits until the
standby is warm, and the standby, not a new process, takes over.
Runs that die at a random moment also see executor JVMs killed mid-batch (Spark recomputes the
lost tasks from lineage on the worker's replacement executor), and one of them the sink down for
SOAK_OUTAGE_S seconds (and until a write has failed against it), which the failure policy rides
out by retrying the batch. Without a standby, the next run starts right after each kill, as the operator
would restart the pod. At the end the producer stops, the last run admits everything it wrote and is
stopped gracefully.

The reference takes nothing from the engine but the batch log: a batch's input is the range its
record names (the files it listed, the Redis entry IDs, the Kafka offsets), read back from the input itself. The
ranges, in batch order, must be exactly what the producer wrote, per stream or directory (nothing
admitted twice, nothing skipped), and every committed batch's counts, running totals and window
must equal those of its input (harness.judge). One line per feed:

    soak: driver_kills=N executor_kills=M batches=B lost=L duplicated=D recovery_p50=Xs ...
          <phase>_p50=Xs <phase>_p90=Ys ... feed=F

(the phases of the restarted drivers' recovery timelines, runtime/timeline.py, in seconds after
each kill).

`make test` runs the redis and kafka feeds and files+standby with 2 + 2 kills (CI_SIZES); `make
soak` runs all three feeds with 20 + 20 and a 20 s outage, `make soak-standby` the same with
standby drivers (SOAK_DRIVER_KILLS, SOAK_EXECUTOR_KILLS, SOAK_OUTAGE_S, SOAK_FEEDS;
SOAK_DURATION_S stretches the runs over at least that many seconds; DSTREAM_FAULT_SEED replays a
schedule; SOAK_MASTER runs the drivers on another master, such as `dstream run`'s default
`local[2]`, which has no executor JVMs to kill).
Recovery is the time from a driver kill to the first batch the next run commits: without a
standby it includes starting the JVM and both executors. With one, the line adds the kills that
found the standby warm (`warm_kills`) and the recoveries measured after them
(`warm_takeover_p50`): a driver killed at its fault point may die before its standby is warm.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self

import psycopg
import pytest
import redis
from conditions import eventually
from confluent_kafka import Producer as KafkaProducer
from dstream.connectors.kafka_sink import BATCH_TIME_HEADER
from dstream.runtime.scheduling.timeline import PHASES
from dstream.worker import textgen
from fault.harness import (
    BatchLogWatch,
    BatchOutput,
    FaultJob,
    Verdict,
    batch_dirs,
    batch_output,
    executor_pids,
    fault_seed,
    judge,
    read_batch,
)
from kafka_server import KafkaServer, read_all, read_range
from postgres_server import PostgresServer, running_postgres
from running_driver import Driver
from servers import RedisServer

DURATION_S = float(os.environ.get("SOAK_DURATION_S", "0"))
FEEDS = os.environ.get("SOAK_FEEDS", "redis,kafka,files+standby").split(",")
MASTER = os.environ.get("SOAK_MASTER", "local-cluster[2,1,1024]")
STANDBY = "+standby"  # a feed's suffix: each run's driver leads with a hot standby beside it
DEATHS = ("random", "random", "before-commit", "commit-write", "batch-record-write")
POLICY = {"retries": 8, "backoffSeconds": 1}  # retries until 255 s after the first failure
STEP_TIMEOUT_S = 300
OUTPUT_RETRIED = "running its outputs failed"  # the scheduler's warning before a retry
LINES_PER_S = 100
TIMELINE = re.compile(r"recovery timeline: phase=(\w+) at=([\d.]+)")
RECORD_BYTES = 60


def is_batch(text: str) -> bool:
    return text.startswith("batch ") and "FAILED" not in text


def is_warm(text: str) -> bool:
    return "standby: warm, following" in text


def warm_now(standby: Driver | None) -> bool:
    return standby is not None and any(is_warm(line.text) for line in standby.lines)


def moment() -> tuple[float, float]:
    """Now, on the monotonic clock the drivers' lines are stamped with and on the wall clock
    their timelines use."""
    return time.monotonic(), time.time()


def leads(text: str) -> bool:
    return "recovery timeline: phase=lead_taken" in text


@dataclass(frozen=True)
class Size:
    """How hard a feed's soak is."""

    driver_kills: int
    executor_kills: int
    outage_s: float


# make test's size per feed; SOAK_DRIVER_KILLS, SOAK_EXECUTOR_KILLS and SOAK_OUTAGE_S set every
# feed's (make soak: 20, 20, 20). Two driver kills are the least that still give each CI run
# what the soak proves (schedule): a kill at a random moment with executor kills and the sink's
# outage in its run, a kill at a fault point, and a restart recovering from a restarted run's
# checkpoint; make test has a time budget, and the many kills are make soak's.
CI_SIZES = {
    "files": Size(3, 3, 5),
    "redis": Size(2, 2, 5),
    "kafka": Size(2, 2, 3),
    "files+standby": Size(2, 2, 5),
}


def size_of(feed: str) -> Size:
    """The feed's CI size, or what the environment asks for."""
    ci = CI_SIZES.get(feed, CI_SIZES["redis"])  # an unknown feed fails in the test, naming it
    return Size(
        int(os.environ.get("SOAK_DRIVER_KILLS", ci.driver_kills)),
        int(os.environ.get("SOAK_EXECUTOR_KILLS", ci.executor_kills)),
        float(os.environ.get("SOAK_OUTAGE_S", ci.outage_s)),
    )


def feed_param(feed: str) -> Any:
    """The feed as a test parameter, with a time limit for its size."""
    size = size_of(feed)
    limit = 600 + 180 * (size.driver_kills + size.executor_kills) + DURATION_S
    return pytest.param(feed, marks=pytest.mark.timeout(limit), id=feed)


# -- the feeds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One line of input where it lives: its stream or directory, and its ID there."""

    partition: str
    id: str
    line: str


class Producer:
    """Writes seeded lines through `write`, a chunk every `every_s` in a thread, from start()
    until stop(): the input arriving throughout. `write` stores a chunk and returns its Records."""

    def __init__(self, seed: int, every_s: float, write: Callable[[list[str]], list[Record]]):
        self._rng = random.Random(seed)
        self._pool = [line.rstrip() for line in textgen.line_pool(seed, RECORD_BYTES)]
        self._every_s = every_s
        self._write = write
        self.written: list[Record] = []
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[Record]:
        """Stop writing; everything written, in order. A failed write fails the soak here."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._error is not None:
            raise AssertionError("the producer failed") from self._error
        return self.written

    def abandon(self) -> None:
        """Stop writing without waiting for the write under way: the soak has failed already,
        and its own error is the one to see."""
        self._stop.set()

    def _run(self) -> None:
        size = round(LINES_PER_S * self._every_s)
        try:
            while not self._stop.wait(self._every_s):  # the producer's pace
                self.written.extend(self._write(self._rng.choices(self._pool, k=size)))
        except BaseException as error:
            self._error = error


class Feed:
    """Where the soak's input comes from and where its output goes: the servers it needs, a
    producer writing input throughout, the sink's outage, and both read back for the verdict."""

    name: str
    every_s: float  # the producer writes a chunk this often

    def __init__(self, root: Path, seed: int):
        self.root = root
        self.producer = Producer(seed, self.every_s, self.write)
        self._resources = ExitStack()

    def __enter__(self) -> Self:
        self.open(self._resources)
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        try:
            if error is None:
                self.producer.stop()
            else:
                self.producer.abandon()
        finally:
            self._resources.close()

    def open(self, resources: ExitStack) -> None:
        """Start what the feed needs; `resources` closes it."""

    def source(self) -> dict[str, Any]:
        raise NotImplementedError

    def sink(self) -> dict[str, Any]:
        raise NotImplementedError

    def write(self, lines: list[str]) -> list[Record]:
        raise NotImplementedError

    def sink_down(self) -> AbstractContextManager[None]:
        """The sink unavailable while the block runs."""
        raise NotImplementedError

    def outage(self, seconds: float, failed: Callable[[], bool]) -> None:
        """The sink down for `seconds`, and until a write has failed against it (`failed`): a
        slow batch's write could otherwise come after a short outage, which then proves nothing."""
        with self.sink_down():
            time.sleep(seconds)  # the outage itself, not a wait for a condition
            eventually(failed, STEP_TIMEOUT_S)

    def admitted(self, ranges: dict[str, Any]) -> list[Record]:
        """The records of a batch's recorded ranges, read back from the input."""
        raise NotImplementedError

    def outputs(self) -> dict[int, BatchOutput]:
        """Every committed batch's output, by batch time."""
        raise NotImplementedError


class FilesFeed(Feed):
    """A file of lines every batch interval into the files source's directory (written under
    a hidden name and renamed, as the source asks), the output into the files sink. The source
    reads a file per task: a file a second would make a catch-up batch dozens of tasks."""

    name = "files"
    every_s = 3.0

    def __init__(self, root: Path, seed: int):
        super().__init__(root, seed)
        self.directory = root / "in"
        self.out = root / "out"
        self.directory.mkdir(parents=True)
        self._files = 0

    def source(self) -> dict[str, Any]:
        return {"type": "files", "files": {"path": str(self.directory)}}

    def sink(self) -> dict[str, Any]:
        return {"type": "files", "files": {"path": str(self.out)}}

    def write(self, lines: list[str]) -> list[Record]:
        self._files += 1
        name = f"{self._files:06d}.txt"
        hidden = self.directory / f".{name}.tmp"
        hidden.write_text("".join(line + "\n" for line in lines))
        hidden.rename(self.directory / name)
        return file_records(name, lines)

    @contextmanager
    def sink_down(self) -> Iterator[None]:
        """A regular file where the sink's directory goes: its volume is gone."""
        aside = self.root / "out-during-outage"
        self.out.rename(aside)
        self.out.write_text("the sink's volume is gone")
        try:
            yield
        finally:
            self.out.unlink()
            aside.rename(self.out)

    def admitted(self, ranges: dict[str, Any]) -> list[Record]:
        return [
            record
            for name in ranges["files"]["files"]
            for record in file_records(name, (self.directory / name).read_text().splitlines())
        ]

    def outputs(self) -> dict[int, BatchOutput]:
        return {time_ms: read_batch(d) for time_ms, d in batch_dirs(self.out).items()}


def file_records(name: str, lines: list[str]) -> list[Record]:
    return [Record("files", f"{name}:{n}", line) for n, line in enumerate(lines, start=1)]


class RedisFeed(Feed):
    """Lines XADDed to two Redis streams four times a second (alternating, so each is a
    partition of the source), the output into PostgreSQL; the outage stops the server."""

    name = "redis"
    every_s = 0.25
    streams = ("soak-a", "soak-b")
    table = "public.soak"

    def open(self, resources: ExitStack) -> None:
        broker = RedisServer(self.root / "redis")
        broker.start()
        resources.callback(broker.stop)
        self.url = broker.url
        self.client = redis.Redis.from_url(broker.url, decode_responses=True)
        for stream in self.streams:  # the source requires its streams to exist at start
            self.client.xgroup_create(stream, "unused", id="$", mkstream=True)
        self.postgres: PostgresServer = resources.enter_context(contextmanager(running_postgres)())

    def source(self) -> dict[str, Any]:
        return {
            "type": "redis",
            "redis": {"url": self.url, "streams": list(self.streams), "field": "line"},
        }

    def sink(self) -> dict[str, Any]:
        dsn, table = self.postgres.dsn(), self.table
        return {"type": "postgres", "postgres": {"dsn": dsn, "table": table, "mode": "append"}}

    def write(self, lines: list[str]) -> list[Record]:
        keys = [self.streams[n % len(self.streams)] for n in range(len(lines))]
        pipe = self.client.pipeline(transaction=False)
        for key, line in zip(keys, lines, strict=True):
            pipe.xadd(key, {"line": line})
        ids = pipe.execute()
        return [Record(*entry) for entry in zip(keys, ids, lines, strict=True)]

    @contextmanager
    def sink_down(self) -> Iterator[None]:
        self.postgres.stop()
        try:
            yield
        finally:
            self.postgres.start()

    def admitted(self, ranges: dict[str, Any]) -> list[Record]:
        return [
            Record(key, entry_id, fields["line"])
            for key, reached in ranges["redis"]["streams"].items()
            for first, last, _count in reached["slices"]
            for entry_id, fields in self.client.xrange(key, first, last)
        ]

    def outputs(self) -> dict[int, BatchOutput]:
        """The batches the sink's commit table holds, each with its rows (a row of a batch
        without a commit row shows as a batch of its own)."""
        batch_ms = "(extract(epoch FROM batch_time) * 1000)::bigint"
        with psycopg.connect(self.postgres.dsn()) as conn:
            committed = conn.execute(
                f"SELECT {batch_ms} FROM dstream_commits WHERE target = %s", (self.table,)
            ).fetchall()
            rows = conn.execute(f"SELECT {batch_ms}, key, value FROM {self.table}").fetchall()
        batches: dict[int, list[Any]] = {time_ms: [] for (time_ms,) in committed}
        for time_ms, key, value in rows:
            batches.setdefault(time_ms, []).append((key, value))
        return {t: batch_output(records, f"batch {t}") for t, records in batches.items()}


class KafkaFeed(Feed):
    """Lines into a Kafka topic of two partitions (alternating) four times a second, by an
    idempotent producer that rides out the broker's absence; the output into another topic
    through the exactly-once Kafka sink. Source and sink share the broker, so the outage is the
    broker itself stopped and started again: reads and writes both wait for it."""

    name = "kafka"
    every_s = 0.25
    topic = "soak-in"
    out = "soak-out"

    def open(self, resources: ExitStack) -> None:
        self.broker = KafkaServer(self.root / "kafka")
        self.broker.format()
        self.broker.start()
        resources.callback(self.broker.stop)
        for topic in (self.topic, self.out):
            self.broker.create_topic(topic, 2)
        self.client = KafkaProducer(
            {"bootstrap.servers": self.broker.bootstrap, "enable.idempotence": True}
        )
        resources.callback(self.client.purge)  # an abandoned write's flush returns at once

    def source(self) -> dict[str, Any]:
        return {
            "type": "kafka",
            "kafka": {"bootstrapServers": self.broker.bootstrap, "topics": [self.topic]},
        }

    def sink(self) -> dict[str, Any]:
        return {
            "type": "kafka",
            "kafka": {"bootstrapServers": self.broker.bootstrap, "topic": self.out},
        }

    def write(self, lines: list[str]) -> list[Record]:
        """Each line once, at the offset its acknowledgement names (librdkafka retries a send
        for up to its message timeout, idempotently, while the broker is away)."""
        acked: dict[int, Record] = {}

        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            key = f"{message.topic()}-{message.partition()}"
            acked[int(message.key())] = Record(key, str(message.offset()), message.value().decode())

        for n, line in enumerate(lines):
            self.client.produce(
                self.topic,
                value=line.encode(),
                key=str(n).encode(),
                partition=n % 2,
                on_delivery=delivered,
            )
        assert self.client.flush(STEP_TIMEOUT_S) == 0, "the soak's input was not acknowledged"
        return [acked[n] for n in range(len(lines))]

    @contextmanager
    def sink_down(self) -> Iterator[None]:
        self.broker.stop()
        try:
            yield
        finally:
            self.broker.start()

    def outage(self, seconds: float, failed: Callable[[], bool]) -> None:
        """The broker down for `seconds` (a failed write is not waited for: with the broker
        gone the batch's reads wait too, and a job stops after 60 s without its input)."""
        with self.sink_down():
            time.sleep(min(seconds, 30))  # the outage itself, not a wait for a condition

    def admitted(self, ranges: dict[str, Any]) -> list[Record]:
        return [
            Record(f"{topic}-{partition}", str(m.offset()), m.value().decode())
            for topic, partition, start, until in ranges["kafka"]["slices"]
            for m in read_range(self.broker.bootstrap, topic, partition, start, until)
        ]

    def outputs(self) -> dict[int, BatchOutput]:
        """The batches the sink's commit records name, each with its messages (a message of a
        batch without a commit record shows as a batch of its own)."""
        commits = read_all(self.broker.bootstrap, "dstream-commits")
        batches: dict[int, list[Any]] = {json.loads(m.value())["batchTimeMs"]: [] for m in commits}
        for message in read_all(self.broker.bootstrap, self.out):
            batch_time = dict(message.headers())[BATCH_TIME_HEADER].decode()
            time_ms = round(datetime.fromisoformat(batch_time).timestamp() * 1000)
            batches.setdefault(time_ms, []).append(
                (json.loads(message.key()), json.loads(message.value()))
            )
        return {t: batch_output(records, f"batch {t}") for t, records in batches.items()}


FEED_TYPES: dict[str, type[Feed]] = {feed.name: feed for feed in (FilesFeed, RedisFeed, KafkaFeed)}


@dataclass
class FeedJob(FaultJob):
    """The soak's faultapp job, reading the feed's source and writing its sink."""

    feed: Feed = field(kw_only=True)

    def source(self) -> dict[str, Any]:
        return self.feed.source()

    def sink(self) -> dict[str, Any]:
        return self.feed.sink()


# -- the schedule ---------------------------------------------------------------------------


@dataclass
class Run:
    """One driver run of the schedule: how it dies, and what happens while it lives."""

    death: str  # "random", or a fault point the driver is killed at (its `arrival`-th time)
    arrival: int = 0
    executor_kills: int = 0
    outage_s: float = 0  # the sink down for this long in this run (0: not in this run)
    lives_s: float = 0  # a random death comes no sooner after the soak's start (SOAK_DURATION_S)


@dataclass
class Tally:
    started: float = field(default_factory=time.monotonic)
    driver_kills: int = 0
    executor_kills: int = 0
    killed_at: float | None = None  # the last driver kill not yet followed by a new commit
    killed_wall: float = 0.0  # the same kill on the wall clock the drivers' timelines use
    killed_into_warm: bool = False  # the last kill found a warm standby (standby feeds)
    warm_kills: int = 0  # kills that found a warm standby
    driver_recoveries: list[float] = field(default_factory=list)
    warm_takeovers: list[float] = field(default_factory=list)  # the recoveries of those kills
    executor_recoveries: list[float] = field(default_factory=list)
    phases: dict[str, list[float]] = field(default_factory=dict)  # seconds after the kill

    def killed(self, at: tuple[float, float], warm: bool) -> None:
        """A driver died `at` (monotonic, wall clock), a warm standby waiting or not."""
        self.killed_at, self.killed_wall = at
        self.killed_into_warm = warm
        self.warm_kills += warm
        self.driver_kills += 1

    def committed(self, at: float) -> None:
        """A driver run committed a batch at `at`: the last kill, if any, is recovered from."""
        if self.killed_at is not None:
            self.driver_recoveries.append(at - self.killed_at)
            if self.killed_into_warm:
                self.warm_takeovers.append(at - self.killed_at)
            self.killed_at = None

    def read_timeline(self, driver: Driver) -> None:
        """At the end of a driver run that followed a kill: the phases of its recovery
        timeline, in seconds after that kill (a standby's start-up, before it, is no part of
        the recovery)."""
        if not self.killed_wall:
            return
        for line in list(driver.lines):
            if found := TIMELINE.search(line.text):
                phase, wall = found.group(1), float(found.group(2))
                if wall >= self.killed_wall:
                    self.phases.setdefault(phase, []).append(wall - self.killed_wall)

    def until(self, lives_s: float) -> float:
        """Seconds from now until `lives_s` after the soak's start (0 when past)."""
        return max(0.0, self.started + lives_s - time.monotonic())


def schedule(rng: random.Random, size: Size) -> list[Run]:
    """size.driver_kills runs, each dying as DEATHS draws (at least one at a random moment, and
    with two runs or more at least one at a fault point, so that even the CI size has both); the
    executor kills spread over the runs that die at a random moment (a run killed at a fault
    point may die before it gets to them); the outage in one of those runs. With a duration,
    the random deaths spread over it."""
    runs = [Run(rng.choice(DEATHS)) for _ in range(size.driver_kills)]
    if not any(r.death == "random" for r in runs):
        runs[0].death = "random"
    elif len(runs) > 1 and all(r.death == "random" for r in runs):
        runs[-1].death = rng.choice([death for death in DEATHS if death != "random"])
    for index, run in enumerate(runs, start=1):
        run.lives_s = DURATION_S * index / (len(runs) + 1)
        if run.death != "random":
            run.arrival = rng.randint(1, 3) if run.death != "batch-record-write" else 2
    randoms = [r for r in runs if r.death == "random"]
    for _ in range(size.executor_kills):
        rng.choice(randoms).executor_kills += 1
    rng.choice(randoms).outage_s = size.outage_s
    return runs


def fault_of(run: Run) -> str | None:
    """The DSTREAM_FAULT_INJECT that kills the run's driver, if it does not die at random."""
    return None if run.death == "random" else f"{run.death}:{run.arrival}"


def start_driver(job: FeedJob, fault: str | None = None, standby: bool = False) -> Driver:
    env = {"SPARK_LOCAL_IP": "127.0.0.1"}
    if fault:
        env["DSTREAM_FAULT_INJECT"] = fault
    args = ("--master", MASTER) + (("--standby",) if standby else ())
    return Driver(job.manifest, *args, env=env, log=job.root / "driver.log").start()


def first_batch(driver: Driver) -> float:
    """When the driver committed its first batch (monotonic seconds); a standby commits none
    before it leads."""
    return driver.wait_for_line(is_batch, STEP_TIMEOUT_S).at


def next_batch(driver: Driver) -> float:
    """When the driver's next batch after now committed (monotonic seconds)."""
    return driver.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(driver.lines)).at


def kill_executors(driver: Driver, job: FeedJob, run: Run, rng: random.Random, tally: Tally):
    if run.executor_kills and not MASTER.startswith("local-cluster"):
        raise ValueError(
            f"SOAK_MASTER={MASTER} has no executor JVMs to kill: set SOAK_EXECUTOR_KILLS=0"
        )
    for _ in range(run.executor_kills):
        executors = eventually(lambda: executor_pids(driver.pid), STEP_TIMEOUT_S)
        time.sleep(rng.uniform(0, job.batch_s))  # somewhere inside a batch
        os.kill(rng.choice(sorted(executors)), signal.SIGKILL)
        killed_at = time.monotonic()
        tally.executor_kills += 1
        tally.executor_recoveries.append(next_batch(driver) - killed_at)


def sink_outage(driver: Driver, feed: Feed, seconds: float) -> None:
    """The sink down: the batches writing meanwhile fail and are retried until one commits."""
    since = len(driver.lines)
    feed.outage(seconds, lambda: any(OUTPUT_RETRIED in t.text for t in driver.lines[since:]))
    next_batch(driver)


def live_through(
    run: Run,
    driver: Driver,
    job: FeedJob,
    rng: random.Random,
    tally: Tally,
    standby: Driver | None = None,
) -> None:
    """Put the run's driver through the run's faults, and kill it (or see it die at its fault
    point). A `standby` beside it is waited for to be warm before a kill at a random moment;
    a driver that dies at its fault point dies when it gets there, warm standby or not."""
    try:
        if run.death == "random":
            tally.committed(first_batch(driver))
            if standby is not None:
                standby.wait_for_line(is_warm, STEP_TIMEOUT_S)
            kill_executors(driver, job, run, rng, tally)
            if run.outage_s:
                sink_outage(driver, job.feed, run.outage_s)
            time.sleep(tally.until(run.lives_s) + rng.uniform(0, job.batch_s))  # when it dies
            tally.read_timeline(driver)
            tally.killed(moment(), warm_now(standby))  # before: a warm standby leads at once
            driver.kill()
        else:
            returned = driver.process.wait(STEP_TIMEOUT_S)
            died, warm = moment(), warm_now(standby)
            driver.kill()  # its JVM and executors with it, as a pod's end takes them all
            assert returned == -signal.SIGKILL, f"{fault_of(run)} did not kill it"
            tally.read_timeline(driver)
            batches = [line.at for line in driver.lines if is_batch(line.text)]
            if batches:  # it may die at its fault point before committing anything
                tally.committed(batches[0])
            tally.killed(died, warm)
    finally:
        driver.kill()


def live_through_schedule(
    runs: list[Run], job: FeedJob, rng: random.Random, tally: Tally, standby: bool
) -> Driver:
    """Each run's driver through its run; the driver of the last run, which the soak's
    schedule does not kill. Without standby, each run's driver starts after the last one died,
    as the operator restarts a pod. With standby, the driver that dies leaves a standby, started
    once it leads, with the fault point of the next run, to take over."""
    driver = start_driver(job, fault_of(runs[0]))
    waiting = None
    try:
        for run, after in zip(runs, [*runs[1:], None], strict=True):
            fault = fault_of(after) if after is not None else None
            if standby:  # started once the driver leads: a standby with no leader leads itself
                driver.wait_for_line(leads, STEP_TIMEOUT_S)
                waiting = start_driver(job, fault, standby=True)
                live_through(run, driver, job, rng, tally, waiting)
                driver, waiting = waiting, None
            else:
                live_through(run, driver, job, rng, tally)
                driver = start_driver(job, fault)
    except BaseException:
        driver.kill()
        if waiting is not None:
            waiting.kill()
        raise
    return driver


def last_run(driver: Driver, job: FeedJob, batch_log: BatchLogWatch, tally: Tally) -> list[Record]:
    """The driver that recovers and works until the soak's duration is over; then the producer
    stops, and once the recorded batches have admitted everything it wrote (the next batch
    planned does, however far behind the clock the batch times are), the driver is stopped
    gracefully, which commits the batch running. Everything the producer wrote."""
    try:
        tally.committed(first_batch(driver))
        time.sleep(tally.until(DURATION_S))  # the rest of the soak's duration
        written = job.feed.producer.stop()
        admitted: dict[int, list[Record]] = {}
        everything = len(written)
        eventually(
            lambda: read_admitted(job.feed, batch_log, admitted) >= everything, STEP_TIMEOUT_S
        )
        assert driver.terminate(timeout_s=120) == 0
        tally.read_timeline(driver)
    finally:
        driver.kill()
    return written


# -- the verdict ----------------------------------------------------------------------------


def word_counts(records: list[Record]) -> Counter[str]:
    return Counter(word for record in records for word in record.line.split())


def admission_problems(admitted: dict[int, list[Record]], written: list[Record]) -> list[str]:
    """How the recorded ranges, in batch order, differ from what the producer wrote, per stream
    or directory: a record admitted twice, skipped, out of order or read back different."""
    sequence = [record for time_ms in sorted(admitted) for record in admitted[time_ms]]
    problems = []
    for partition in sorted({r.partition for r in written + sequence}):
        got = [r for r in sequence if r.partition == partition]
        want = [r for r in written if r.partition == partition]
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            at = next((n for n, (a, b) in pairs if a != b), min(len(got), len(want)))
            problems.append(
                f"{partition}: {len(got)} records admitted, {len(want)} written; the first "
                f"difference at #{at}: admitted {got[at : at + 1]}, written {want[at : at + 1]}"
            )
    return problems


def read_admitted(feed: Feed, batch_log: BatchLogWatch, admitted: dict[int, list[Record]]) -> int:
    """Add the records of each batch recorded since the last call to `admitted`, read back
    from the input (once per batch: a record never changes); how many records that makes."""
    for time_ms, record in list(batch_log.records.items()):
        if time_ms not in admitted:
            admitted[time_ms] = feed.admitted(record["ranges"])
    return sum(len(records) for records in admitted.values())


def verify_feed(
    job: FeedJob, batch_log: BatchLogWatch, written: list[Record]
) -> tuple[Verdict, list[str]]:
    """The verdict over every committed batch, and what is wrong with the admitted ranges."""
    admitted: dict[int, list[Record]] = {}
    read_admitted(job.feed, batch_log, admitted)
    problems = admission_problems(admitted, written)
    problems += [f"batch record {t} rewritten" for t in batch_log.rewritten]
    inputs = {t: word_counts(records) for t, records in admitted.items()}
    verdict = judge(job, job.feed.outputs(), inputs, word_counts(written), len(written))
    return verdict, problems


def seconds(values: list[float], pick) -> str:
    return f"{pick(values):.1f}s" if values else "-"


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]


def soak_line(tally: Tally, verdict: Verdict, feed: str) -> str:
    """The summary: counts, the verdict, recovery p50/max, and per phase of the restarted
    drivers' timelines (runtime/timeline.py) its p50/p90 in seconds after the kill."""
    recoveries = tally.driver_recoveries
    warm = (
        f"warm_kills={tally.warm_kills} warm_takeovers={len(tally.warm_takeovers)} "
        f"warm_takeover_p50={seconds(tally.warm_takeovers, statistics.median)} "
        f"warm_takeover_max={seconds(tally.warm_takeovers, max)} "
        if feed.endswith(STANDBY)
        else ""
    )
    phases = " ".join(
        f"{phase}_p50={seconds(tally.phases[phase], statistics.median)} "
        f"{phase}_p90={seconds(tally.phases[phase], p90)}"
        for phase in PHASES
        if phase in tally.phases
    )
    return (
        f"soak: driver_kills={tally.driver_kills} executor_kills={tally.executor_kills} "
        f"batches={verdict.batches} lost={verdict.lost} duplicated={verdict.duplicated} "
        f"recovery_p50={seconds(recoveries, statistics.median)} "
        f"recovery_p90={seconds(recoveries, p90)} "
        f"recovery_max={seconds(recoveries, max)} "
        f"executor_recovery_p50={seconds(tally.executor_recoveries, statistics.median)} "
        f"executor_recovery_p90={seconds(tally.executor_recoveries, p90)} "
        f"executor_recovery_max={seconds(tally.executor_recoveries, max)} {warm}{phases} "
        f"feed={feed}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("feed_type", [feed_param(feed) for feed in FEEDS])
def test_soak_under_driver_and_executor_kills_and_a_sink_outage(feed_type, tmp_path):
    print(f"\nSOAK_FEEDS={feed_type}")
    seed = fault_seed()
    rng = random.Random(seed)
    source = feed_type.removesuffix(STANDBY)
    assert source in FEED_TYPES, f"SOAK_FEEDS: no feed {feed_type!r}, only {list(FEED_TYPES)}"
    size = size_of(feed_type)
    with FEED_TYPES[source](tmp_path, seed) as feed:
        job = FeedJob(
            tmp_path,
            batch_s=3,
            window_s=15,
            checkpoint_interval_s=6,
            parallelism=2,
            extra_spec={"failurePolicy": POLICY},
            feed=feed,
        )
        job.write()
        tally = Tally()
        with BatchLogWatch(job.checkpoint) as batch_log:
            feed.producer.start()
            runs = schedule(rng, size)
            driver = live_through_schedule(runs, job, rng, tally, feed_type.endswith(STANDBY))
            written = last_run(driver, job, batch_log, tally)
        verdict, problems = verify_feed(job, batch_log, written)
    print(soak_line(tally, verdict, feed_type))
    assert (tally.driver_kills, tally.executor_kills) == (size.driver_kills, size.executor_kills)
    if feed_type.endswith(STANDBY):  # a kill at a random moment always waits for a warm one
        assert tally.warm_kills >= sum(run.death == "random" for run in runs), tally
    assert not problems, problems
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0


def test_every_schedule_of_two_kills_or_more_has_a_random_death_and_one_at_a_fault_point():
    """What even the CI size proves: a kill at a random moment (which hosts the executor kills
    and the outage) and one at a fault point, whatever the seed."""
    for seed in range(300):
        for kills in (2, 3, 20):
            runs = schedule(random.Random(seed), Size(kills, kills, 5))
            assert {run.death == "random" for run in runs} == {True, False}, (seed, runs)
            assert sum(run.executor_kills for run in runs) == kills and any(
                r.outage_s for r in runs
            )
