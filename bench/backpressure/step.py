"""`python -m bench.backpressure`: an overload step, dstream against pyspark.streaming, side by side.

Both systems run the same program (per-partition Counter word count, reduceByKey, each batch's
counts collected) on 100-byte textgen lines, 1 s batches, local[2], both on dstream's Python
worker daemon, each in its own worker process (its own JVM), one after the other:

1. calibration, backpressure off: batches at a tiny rate, at a fixed rate and at 0.6x the
   rate that predicts; a line through (records, processing time) gives the rate at which a batch
   takes one interval, the rate the job sustains (`overload.fit_cost`);
2. the step, backpressure on (initialRate 2x the sustainable rate): 0.3x for `--low-s`, then
   10x for `--overload-s`.

dstream reads a rate source whose offered rate follows the schedule (records wait at the source
until a batch admits them); pyspark.streaming reads `socketTextStream` from a socket server in
the worker (a thread sending a cycled buffer of textgen lines over loopback TCP at the
schedule's pace; its receiver's rate limiter is where pyspark.streaming's backpressure acts,
and TCP makes the server wait for it, so the records wait at the server). Per batch the workers
report offered and admitted records, processing time, scheduling delay and rate limit, and
each checks its output: the counts summed over the run must equal the word counts of exactly
the records its batches admitted, computed from the source independently of Spark.

The parent samples the 1-minute load and the CPU used by other processes, and writes
bench/results/backpressure-<date>.{md,json,png}; `--docs-png PATH` also draws dstream's run
alone for docs/backpressure.md.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.backpressure import overload
from bench.backpressure.overload import CostModel, RateSchedule
from bench.common import (
    ENGINES,
    PARTITIONS,
    RECORD_BYTES,
    RESULTS,
    ROOT,
    SEED,
    emit,
    kill_group,
    spark_conf,
    textgen,
)

DEFAULT_INTERVAL_S = 1.0
LOW, HIGH, INITIAL = 0.3, 10.0, 2.0  # times the sustainable rate
SETTLED_DELAY_INTERVALS = 2
MIN_SETTLED_BATCHES = 5
CALIBRATION = ((1_000, 5.0), (20_000, 6.0))  # (records/s, seconds), then 0.6x the prediction
SOCKET_LINES = 65_536  # the socket server cycles through this many lines


# -- the program, the same text for both systems ----------------------------------------------


def word_counts(lines: Any) -> Any:
    """Per batch: each partition's words counted in a Counter (as dstream's wordcount app does),
    then summed per word."""
    from dstream.worker.tasks import count_words

    return lines.mapPartitions(count_words).reduceByKey(operator.add)


def collect_into(outputs: dict[int, Counter[str]]) -> Callable[[Any, Any], None]:
    def collect(time: datetime, rdd: Any) -> None:
        outputs[round(time.timestamp() * 1000)] = Counter(dict(rdd.collect()))

    return collect


# -- the sources --------------------------------------------------------------------------


def rate_source(ssc: Any, schedule: RateSchedule) -> Any:
    """dstream's rate source with the schedule's offered rate: the records that arrived by a
    batch time are the schedule's total then (the engine's own source has one fixed rate)."""
    from dstream.sources import RateInputDStream

    class ScheduledRateStream(RateInputDStream):
        def _available(self, time_ms: int) -> list[int]:
            base, extra = divmod(schedule.total(time_ms / 1000), self.partitions)
            return [base + (1 if p < extra else 0) for p in range(self.partitions)]

    return ScheduledRateStream(ssc, 1, PARTITIONS, SEED, RECORD_BYTES)


def socket_line_indexes() -> Any:
    """Pool indexes of the socket server's lines: the rate source's global sequence (number v
    is record (v mod 2, v div 2)) for the first SOCKET_LINES numbers, cycled."""
    import numpy as np

    v = np.arange(SOCKET_LINES, dtype=np.uint64)
    return pool_indexes(v % PARTITIONS, v // PARTITIONS)


class SocketServer:
    """Serves one client the cycled lines at the schedule's pace, from when it connects.

    Sending is a slice of a prebuilt buffer per write, so feeding costs almost no CPU; when the
    receiver reads slower, sendall blocks and the records wait here (`lag`).
    """

    def __init__(self, rate: float):
        pool = textgen.line_pool(SEED, RECORD_BYTES)
        self._line_bytes = RECORD_BYTES + 1
        self._buffer = b"".join(pool[i].encode() + b"\n" for i in socket_line_indexes().tolist())
        self._rate = rate
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.schedule: RateSchedule | None = None
        self.connected = threading.Event()
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="socket-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        connection, _ = self._listener.accept()
        self.schedule = RateSchedule(time.time(), self._rate)
        self.connected.set()
        chunk = 10_000
        try:
            while not self._stop.is_set():
                target = self.schedule.total(time.time())
                if self.sent >= target:
                    time.sleep(0.005)
                    continue
                start = self.sent % SOCKET_LINES
                count = min(target - self.sent, chunk, SOCKET_LINES - start)
                view = memoryview(self._buffer)[
                    start * self._line_bytes : (start + count) * self._line_bytes
                ]
                connection.sendall(view)
                self.sent += count
        except OSError:
            pass  # the receiver went away at stop
        finally:
            connection.close()

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()


# -- the reference: word counts of admitted records, computed without Spark ---------------------


def pool_indexes(partition: Any, offset: Any) -> Any:
    """textgen.line_index over numpy arrays (uint64 arithmetic wraps like splitmix64's)."""
    import numpy as np

    with np.errstate(over="ignore"):
        z = (
            offset.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
            + partition.astype(np.uint64) * np.uint64(0xBF58476D1CE4E5B9)
            + np.uint64(SEED)
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return ((z ^ (z >> np.uint64(31))) % np.uint64(textgen.POOL_SIZE)).astype(np.int64)


def words_of(multiplicity: Any) -> Counter[str]:
    """Word counts of records given how many times each pool line occurs."""
    pool = textgen.line_pool(SEED, RECORD_BYTES)
    counts: Counter[str] = Counter()
    for index in multiplicity.nonzero()[0].tolist():
        times = int(multiplicity[index])
        for word, n in Counter(pool[index].split()).items():
            counts[word] += n * times
    return counts


def rate_source_words(ends: list[int]) -> Counter[str]:
    """Word counts of offsets [0, end) of each partition of the rate source."""
    import numpy as np

    multiplicity = np.zeros(textgen.POOL_SIZE, dtype=np.int64)
    for partition, end in enumerate(ends):
        for start in range(0, end, 5_000_000):
            offsets = np.arange(start, min(end, start + 5_000_000), dtype=np.uint64)
            indexes = pool_indexes(np.full(len(offsets), partition, dtype=np.uint64), offsets)
            multiplicity += np.bincount(indexes, minlength=textgen.POOL_SIZE)
    return words_of(multiplicity)


def socket_words(records: int) -> Counter[str]:
    """Word counts of the first `records` lines the socket server sends."""
    import numpy as np

    indexes = socket_line_indexes()
    cycles, rest = divmod(records, SOCKET_LINES)
    multiplicity = cycles * np.bincount(indexes, minlength=textgen.POOL_SIZE)
    multiplicity += np.bincount(indexes[:rest], minlength=textgen.POOL_SIZE)
    return words_of(multiplicity)


# -- one system in its worker process --------------------------------------------------------


class Run:
    """One streaming run of the program: its batches as the system's listener reported them."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.outputs: dict[int, Counter[str]] = {}
        self.started: dict[int, float] = {}  # batch time ms -> scheduling delay s
        self.batches: list[dict[str, Any]] = []
        self.covered: set[int] = set()  # batch times run, or merged into one that ran
        self.lock = threading.Lock()

    def completed(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.batches.append(row)

    def wait_batches(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.batches) < count and time.monotonic() < deadline:
            time.sleep(0.1)

    def wait_until_done(self, time_s: float, timeout_s: float) -> None:
        """Until the batch at time_s (or a later one) has completed, or the timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                if any(b["time_s"] >= time_s for b in self.batches):
                    return
            time.sleep(0.1)


def spark_context(backpressure: bool, initial_rate: float | None) -> Any:
    from pyspark import SparkContext

    conf = spark_conf("local[2]", PARTITIONS, "dstream.worker.pydaemon")
    conf.set("spark.app.name", "dstream-bench-backpressure")
    # A receiver cuts a block every blockInterval, a partition each: 500 ms gives
    # pyspark.streaming's 1 s batches 2 partitions, as many as dstream's rate source has.
    conf.set("spark.streaming.blockInterval", "500ms")
    if backpressure:
        conf.set("spark.streaming.backpressure.enabled", "true")
        conf.set("spark.streaming.backpressure.initialRate", str(round(initial_rate or 0)))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


class DStreamRunner:
    """Starts the program on dstream with a scheduled rate source."""

    name = "dstream"

    def __init__(self, sc: Any):
        self.sc = sc

    def start(self, rate: float, run: Run) -> tuple[RateSchedule, Callable[[], dict[str, Any]]]:
        from dstream import StreamingContext

        ssc = StreamingContext(self.sc, run.interval_s)
        schedule = RateSchedule(time.time(), rate)
        source = rate_source(ssc, schedule)
        word_counts(source).foreachRDD(collect_into(run.outputs))
        ssc.addStreamingListener(DStreamListener(run, schedule))
        ssc.start()

        def stop() -> dict[str, Any]:
            stopped = time.time()
            ssc.stop(stopSparkContext=False)  # after the running batch
            for info in ssc._scheduler.history:
                run.covered.update([info.batch_time_ms, *info.coalesced])
            ends = list(source._next)
            return {
                "stopped_s": stopped,
                "handed_out": sum(ends),
                "all_completed": True,
                "expected": lambda: rate_source_words(ends),
            }

        return schedule, stop


class DStreamListener:
    def __init__(self, run: Run, schedule: RateSchedule):
        self._run, self._schedule = run, schedule

    def onBatchCompleted(self, event: Any) -> None:
        info = event.batchInfo()
        if info.error is not None:
            emit(event="error", system="dstream", error=info.error)
            return
        t = info.batch_time_ms
        self._run.started[t] = info.schedulingDelay() / 1000
        limits = [v for v in info.rate_limits.values() if v is not None]
        self._run.completed(
            batch_row(
                self._schedule,
                self._run.interval_s,
                t,
                info.numRecords(),
                info.processingDelay(),
                info.schedulingDelay(),
                limits[0] if limits else None,
                len(info.coalesced),
            )
        )


def batch_row(
    schedule: RateSchedule,
    interval_s: float,
    time_ms: int,
    records: int,
    processing_ms: int,
    scheduling_ms: int,
    rate_limit: float | None,
    coalesced: int,
) -> dict[str, Any]:
    t = time_ms / 1000
    return {
        "time_s": t,
        "offered": schedule.total(t) - schedule.total(t - interval_s),
        "records": records,
        "processing_s": processing_ms / 1000,
        "scheduling_s": scheduling_ms / 1000,
        "rate_limit": rate_limit,
        "coalesced": coalesced,
    }


class LegacyRunner:
    """Starts the program on pyspark.streaming reading a socket server."""

    name = "pyspark.streaming"

    def __init__(self, sc: Any):
        self.sc = sc

    def start(self, rate: float, run: Run) -> tuple[RateSchedule, Callable[[], dict[str, Any]]]:
        from pyspark.streaming import StreamingContext

        server = SocketServer(rate)
        ssc = StreamingContext(self.sc, run.interval_s)
        lines = ssc.socketTextStream("127.0.0.1", server.port)
        word_counts(lines).foreachRDD(collect_into(run.outputs))
        ssc.addStreamingListener(legacy_listener(run, server, ssc))
        ssc.start()
        if not server.connected.wait(60):
            raise RuntimeError("pyspark.streaming's receiver did not connect within 60 s")
        assert server.schedule is not None

        def stop() -> dict[str, Any]:
            stopped = time.time()
            ssc.stop(stopSparkContext=False, stopGraceFully=False)
            server.stop()
            run.covered.update(run.started)
            admitted = sum(b["records"] for b in run.batches)
            return {
                "stopped_s": stopped,
                "handed_out": server.sent,
                "all_completed": False,
                "expected": lambda: socket_words(admitted),
            }

        return server.schedule, stop


def legacy_listener(run: Run, server: SocketServer, ssc: Any) -> Any:
    from pyspark.streaming.listener import StreamingListener

    def latest_rate() -> float | None:
        """The receiver's rate limit, from the JVM's rate controller (not exposed to Python)."""
        try:
            stream = ssc._jssc.ssc().graph().getReceiverInputStreams()[0]
            controller = stream.rateController()
            rate = controller.get().getLatestRate() if controller.isDefined() else -1
            return float(rate) if rate >= 0 else None  # -1: no estimate yet
        except Exception:  # py4j: the method is private[streaming] and may change
            return None

    class Collector(StreamingListener):
        def onBatchStarted(self, batchStarted: Any) -> None:
            info = batchStarted.batchInfo()
            run.started[info.batchTime().milliseconds()] = info.schedulingDelay() / 1000

        def onBatchCompleted(self, batchCompleted: Any) -> None:
            info = batchCompleted.batchInfo()
            t = info.batchTime().milliseconds()
            assert server.schedule is not None
            row = batch_row(
                server.schedule,
                run.interval_s,
                t,
                info.numRecords(),
                info.processingDelay(),
                info.schedulingDelay(),
                latest_rate(),
                0,
            )
            row["sent"] = server.sent
            run.completed(row)

    return Collector()


RUNNERS = {"dstream": DStreamRunner, "pyspark.streaming": LegacyRunner}


def calibrate(system: str, interval_s: float) -> CostModel:
    """The cost model of the program on `system`, backpressure off (see the module docstring).
    The first batches (Python workers starting, first jobs) are left out."""
    sc = spark_context(backpressure=False, initial_rate=None)
    try:
        run = Run(interval_s)
        schedule, stop = RUNNERS[system](sc).start(CALIBRATION[0][0], run)
        run.wait_batches(3, 120)
        phases: list[tuple[float, float]] = list(CALIBRATION)
        measured_from: list[float] = []
        samples: list[tuple[int, float]] = []
        for index in range(3):
            if index == 2:
                model = overload.fit_cost(samples)
                rate = 0.6 * model.sustainable(interval_s) if model.fixed_s < interval_s else 0
                phases.append((max(rate, 2 * CALIBRATION[1][0]), 8.0))
            rate, seconds = phases[index]
            at = math.ceil(time.time())
            schedule.set(at, rate)
            measured_from.append(at + 2)  # the batch at at + 1 may still be catching up
            time.sleep(at + seconds - time.time())
            run.wait_until_done(at + seconds - 1, 30)
            samples = calibration_samples(run, measured_from, seconds)
            emit(event="calibration-phase", system=system, rate=rate, batches=len(run.batches))
        stop()
        samples = calibration_samples(run, measured_from, seconds)
        model = overload.fit_cost(samples)
        emit(
            event="calibration",
            system=system,
            fixed_s=model.fixed_s,
            per_record_s=model.per_record_s,
            sustainable=model.sustainable(interval_s),
            samples=samples,
        )
        return model
    finally:
        sc.stop()


def calibration_samples(
    run: Run, measured_from: list[float], seconds: float
) -> list[tuple[int, float]]:
    """(records, processing s) of the batches in the measured part of each phase."""
    with run.lock:
        return [
            (b["records"], b["processing_s"])
            for b in run.batches
            if any(start <= b["time_s"] < start - 2 + seconds for start in measured_from)
        ]


def step(
    system: str, sustainable: float, low_s: float, overload_s: float, interval_s: float
) -> None:
    """0.3x the sustainable rate, then 10x; report every batch and the output check."""
    sc = spark_context(backpressure=True, initial_rate=INITIAL * sustainable)
    try:
        run = Run(interval_s)
        schedule, stop = RUNNERS[system](sc).start(LOW * sustainable, run)
        run.wait_batches(3, 120)  # the first batches start Python workers: not the low phase
        step_s = math.ceil(time.time() + low_s)
        schedule.set(step_s, HIGH * sustainable)
        emit(
            event="step",
            system=system,
            step_s=step_s,
            start_s=schedule.start_s,
            low=LOW * sustainable,
            high=HIGH * sustainable,
        )
        time.sleep(max(0.0, step_s + overload_s - time.time()))
        ended = stop()
        with run.lock:
            batches = sorted(run.batches, key=lambda b: b["time_s"])
        outputs = run.outputs
        admitted = {round(b["time_s"] * 1000): b["records"] for b in batches}
        problems = overload.output_problems(
            outputs, admitted, ended["expected"](), ended["handed_out"], ended["all_completed"]
        )
        first_ms = min(run.covered, default=round(step_s * 1000))
        pending = overload.pending_delays(run.covered, first_ms, ended["stopped_s"], interval_s)
        delays = [(t / 1000, d) for t, d in run.started.items()] + pending
        settle = overload.settle_time(
            delays, step_s, SETTLED_DELAY_INTERVALS * interval_s, MIN_SETTLED_BATCHES
        )
        emit(
            event="run",
            system=system,
            step_s=step_s,
            stopped_s=ended["stopped_s"],
            batches=batches,
            pending=pending,
            handed_out=ended["handed_out"],
            offered_total=schedule.total(ended["stopped_s"]),
            problems=problems,
            settle_s=settle,
        )
    finally:
        sc.stop()


def worker(system: str, args: argparse.Namespace) -> int:
    model = calibrate(system, args.interval_s)
    if model.fixed_s >= args.interval_s:
        emit(event="unsustainable", system=system, fixed_s=model.fixed_s)
        return 0
    step(system, model.sustainable(args.interval_s), args.low_s, args.overload_s, args.interval_s)
    return 0


# -- the parent: workers, load, report -------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(ENGINES))
    parser.add_argument("--low-s", type=float, default=10.0, help="seconds at 0.3x before the step")
    parser.add_argument("--overload-s", type=float, default=40.0, help="seconds at 10x")
    parser.add_argument(
        "--interval-s",
        type=float,
        default=DEFAULT_INTERVAL_S,
        help="batch interval of both systems (longer when pyspark.streaming's fixed cost per "
        "batch exceeds 1 s on a loaded machine)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--docs-png", type=Path, help="also draw dstream's run alone here")
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args)
    from bench.backpressure.report import write_report

    command = "python -m bench.backpressure " + " ".join(argv if argv is not None else sys.argv[1:])
    results = {"systems": {}, "command": command.strip(), "interval_s": args.interval_s}
    for system in args.systems.split(","):
        results["systems"][system] = run_worker(system, args)
    report = write_report(results, args.out, args.docs_png)
    failed = [name for name, result in results["systems"].items() if result["returncode"]]
    for name in failed:
        print(f"{name}'s worker failed: {args.out}/logs/backpressure-{name}.log", file=sys.stderr)
    print(f"wrote {report}", file=sys.stderr)
    return 1 if failed else 0


def run_worker(system: str, args: argparse.Namespace) -> dict[str, Any]:
    """One system's worker process, with the machine's load sampled while it runs."""
    from bench.machine import LoadMonitor

    command = [
        sys.executable,
        "-m",
        "bench.backpressure",
        "--worker",
        system,
        "--low-s",
        str(args.low_s),
        "--overload-s",
        str(args.overload_s),
        "--interval-s",
        str(args.interval_s),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = args.out / "logs" / f"backpressure-{system}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    events: list[dict[str, Any]] = []
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        try:
            with LoadMonitor(period=2.0, root_pid=process.pid) as monitor:
                assert process.stdout is not None
                for line in process.stdout:
                    if line.startswith("{"):
                        events.append(json.loads(line))
                        print(f"  {system}: {line.strip()[:160]}", file=sys.stderr, flush=True)
                process.wait()
        finally:
            kill_group(process)  # what is left of it: its JVM, its Python workers
    load = [{"load1": s.load1, "other_cores": s.others_cores} for s in monitor.samples]
    return {"events": events, "load": load, "returncode": process.returncode}
