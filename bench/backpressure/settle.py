"""`python -m bench.backpressure.settle`: how long a job takes to reach its steady latency after a
cold start, and after a burst that follows a quiet spell; with `--before REV`, on the engine of
that git revision too, interleaved with this tree's.

Two jobs, each run as a user runs it (`dstream run`, `local[2]`, the JVM's defaults), in a fresh
driver process every time:

- cold: the tutorial's WordCount (examples/wordcount.yaml) with 500 ms batches, a 30 s window
  sliding every 500 ms and 50,000 lines/s (`--rate`), its initialRate 20,000/s, watched for its
  first two minutes (`--observe-s`);
- burst: a Kafka -> Kafka copy (500 ms batches, exactly-once sink) fed 100 records/s for a minute
  (`--quiet-rate`, `--quiet-s`), then 20,000/s for a minute (`--burst-rate`, `--burst-s`), on a
  broker started for the run (tests/kafka_server.py, as `python -m bench --source kafka` does).

Per run: the time to steady state, from the first batch (cold) or from the burst's start, to
the first batch that begins STEADY_BATCHES batches in a row whose p99 latency is within
`--steady-s`; the records' p50 and p99 latency over the window (the engine's histogram
`dstream_end_to_end_latency_seconds`, scraped at the window's ends and interpolated within its
buckets); the lowest rate limit (cold) and the limit the burst met; the CPU other processes
used meanwhile. Round k runs the engines in turn, reversed every other round (A B, B A, ...), so
that the machine's load weighs on both alike. Writes bench/results/<date>-backpressure.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import RESULTS, ROOT

STEADY_BATCHES = 10  # batches in a row within the steady latency: the job has settled
LATENCY_METRIC = "dstream_end_to_end_latency_seconds"
START_TIMEOUT_S = 300  # from the driver's start to its first batch, on a loaded machine
STOP_TIMEOUT_S = 60


# -- what a run's batches and histogram say (pure) ----------------------------------------------


@dataclass(frozen=True)
class Batch:
    t_s: float  # batch time, seconds after the run's reference instant
    records: int
    limit: float | None
    processing_s: float
    p99_s: float | None


def batches_of(api_batches: list[dict[str, Any]], reference_s: float) -> list[Batch]:
    """`GET /v1/batches` rows, oldest first, timed from `reference_s` (epoch seconds)."""
    rows = [
        Batch(
            datetime.fromisoformat(b["time"]).timestamp() - reference_s,
            b["records"],
            next(iter(b["rateLimit"].values()), None),
            b["processingSeconds"] or 0.0,
            b["latencyP99Seconds"],
        )
        for b in api_batches
    ]
    return sorted(rows, key=lambda b: b.t_s)


def timeline(batches: list[Batch]) -> list[list[Any]]:
    """The batches as rows for the JSON results: time, records, limit, processing, p99."""
    return [[round(b.t_s, 2), b.records, b.limit, b.processing_s, b.p99_s] for b in batches]


def time_to_steady(batches: list[Batch], from_s: float, steady_s: float) -> float | None:
    """Seconds from `from_s` to the first batch (at or after it) that begins STEADY_BATCHES
    batches in a row whose p99 latency is at most `steady_s` (a batch without records counts
    as steady); None when no such run of batches came."""
    after = [b for b in batches if b.t_s >= from_s]
    for i in range(len(after) - STEADY_BATCHES + 1):
        run = after[i : i + STEADY_BATCHES]
        if all(b.p99_s is None or b.p99_s <= steady_s for b in run):
            return after[i].t_s - from_s
    return None


def histogram(metrics_text: str, name: str = LATENCY_METRIC) -> dict[float, float]:
    """Cumulative bucket counts by upper bound (le), summed over label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    return buckets


def quantile(later: dict[float, float], earlier: dict[float, float], q: float) -> float | None:
    """The q-quantile of what the histogram counted between two scrapes, interpolated within
    its bucket (as Prometheus's histogram_quantile); math.inf when it lies above the last
    finite bound; None when nothing was counted."""
    bounds = sorted(later)
    counts = [later[b] - earlier.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    below_bound, below_count = 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return math.inf
            share = (rank - below_count) / (count - below_count) if count > below_count else 1
            return below_bound + (bound - below_bound) * share
        below_bound, below_count = bound, count
    return math.inf


# -- engines and drivers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    name: str
    tree: Path  # holds driver/ and api/

    @property
    def pythonpath(self) -> str:
        return os.pathsep.join([str(self.tree / "driver"), str(self.tree / "api"), str(ROOT)])


def engine_at(revision: str) -> Engine:
    """The engine (driver/ and api/) of a git revision, extracted into a temporary directory."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", revision],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    ).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix=f"bench-engine-{commit}-"))
    archive = subprocess.run(
        ["git", "archive", commit, "driver", "api"], check=True, capture_output=True, cwd=ROOT
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return Engine(f"{revision} ({commit})", tree)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Driver:
    """`dstream run MANIFEST` of one engine, in a process group of its own, its API on a port."""

    def __init__(self, engine: Engine, manifest: Path, log: Path):
        self.port = free_port()
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "dstream", "run", str(manifest)]
                + ["--port", str(self.port), "--quiet"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={
                    **os.environ,
                    "PYTHONPATH": engine.pythonpath,
                    "PYSPARK_PYTHON": sys.executable,
                    "DSTREAM_SPARK_LOG_LEVEL": "ERROR",
                },
                cwd=ROOT,
                start_new_session=True,
            )

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"http://127.0.0.1:{self.port}{path}", params=params, timeout=60)

    def batches(self) -> list[dict[str, Any]]:
        return self.get("/v1/batches", limit=1000).json()["batches"]

    def latency_histogram(self) -> dict[float, float]:
        return histogram(self.get("/metrics").text)

    def first_batch_s(self) -> float:
        """Epoch seconds of the first batch's time, once it has completed."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the driver exited ({self.process.returncode}) at start")
            try:
                batches = self.batches()
            except httpx.TransportError:
                batches = []
            if batches:
                return min(datetime.fromisoformat(b["time"]).timestamp() for b in batches)
            time.sleep(0.5)
        raise TimeoutError(f"no batch within {START_TIMEOUT_S} s")

    def stop(self) -> None:
        """SIGTERM to the group (the running batch commits), then SIGKILL what is left."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(STOP_TIMEOUT_S)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def sleep_until(epoch_s: float) -> None:
    time.sleep(max(0.0, epoch_s - time.time()))


# -- the cold start --------------------------------------------------------------------------------


def cold_manifest(directory: Path, args: argparse.Namespace) -> Path:
    """examples/wordcount.yaml as the issue ran it: 500 ms batches, a 30 s window, --rate."""
    document = yaml.safe_load((ROOT / "examples" / "wordcount.yaml").read_text())
    spec = document["spec"]
    spec["batchInterval"] = "500ms"
    spec["app"]["args"] = {"window": "30s", "slide": "500ms"}
    spec["source"]["rate"]["recordsPerSecond"] = args.rate
    spec["checkpoint"] = {"path": str(directory / "checkpoint")}
    path = directory / "wordcount.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_cold(engine: Engine, args: argparse.Namespace, label: str) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-cold-"))
    driver = Driver(engine, cold_manifest(directory, args), args.logs / f"{label}.log")
    try:
        first_s = driver.first_batch_s()
        sleep_until(first_s + args.observe_s)
        hist = driver.latency_histogram()
        batches = batches_of(driver.batches(), first_s)
    finally:
        driver.stop()
    limits = [b.limit for b in batches[1:] if b.limit is not None]
    return {
        "steady_s": time_to_steady(batches, 0.0, args.steady_s),
        "p50_s": quantile(hist, {}, 0.5),
        "p99_s": quantile(hist, {}, 0.99),
        "first_batch_s": batches[0].processing_s if batches else None,
        "lowest_limit": min(limits, default=None),
        "timeline": timeline(batches),
    }


# -- the Kafka burst --------------------------------------------------------------------------------


class Feeder:
    """Produces fixed 100-byte lines to a topic at a rate that can change, from a thread."""

    def __init__(self, bootstrap: str, topic: str, rate: float):
        from confluent_kafka import Producer

        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._topic, self._rate, self.sent = topic, rate, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feeder", daemon=True)
        self._thread.start()

    def set_rate(self, rate: float) -> None:
        self._rate = rate

    def _loop(self) -> None:
        line = b"x" * 99
        credit, last = 0.0, time.monotonic()
        while not self._stop.wait(0.02):
            now = time.monotonic()
            credit += self._rate * (now - last)
            last = now
            for _ in range(int(credit)):
                self._producer.produce(self._topic, value=line)
            self.sent += int(credit)
            credit -= int(credit)
            self._producer.poll(0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush(30)


def burst_manifest(directory: Path, bootstrap: str, topics: tuple[str, str]) -> Path:
    connection = {"bootstrapServers": bootstrap}
    spec = {
        "batchInterval": "500ms",
        "app": {"module": "bench.backpressure.copyapp:build"},
        "source": {
            "type": "kafka",
            "kafka": {**connection, "topics": [topics[0]], "startingOffsets": "earliest"},
        },
        "sink": {
            "type": "kafka",
            "kafka": {
                **connection,
                "topic": topics[1],
                "delivery": "exactlyOnce",
                "format": "text",
            },
        },
        "checkpoint": {"path": str(directory / "checkpoint")},
        "backpressure": {"enabled": True, "initialRate": 20000, "minRate": 100},
    }
    document = {
        "apiVersion": "dstream.dev/v1alpha1",
        "kind": "StreamingJob",
        "metadata": {"name": "kafka-copy"},
        "spec": spec,
    }
    path = directory / "copy.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run_burst(engine: Engine, args: argparse.Namespace, broker: Any, label: str) -> dict[str, Any]:
    directory = Path(tempfile.mkdtemp(prefix="bench-burst-"))
    topics = (f"copy-in-{uuid.uuid4().hex[:8]}", f"copy-out-{uuid.uuid4().hex[:8]}")
    for topic in topics:
        broker.create_topic(topic, 2)
    feeder = Feeder(broker.bootstrap, topics[0], args.quiet_rate)
    manifest = burst_manifest(directory, broker.bootstrap, topics)
    driver = Driver(engine, manifest, args.logs / f"{label}.log")
    try:
        sleep_until(driver.first_batch_s() + args.quiet_s)
        before = driver.latency_histogram()
        burst_s = time.time()
        feeder.set_rate(args.burst_rate)
        sleep_until(burst_s + args.burst_s)
        after = driver.latency_histogram()
        batches = batches_of(driver.batches(), burst_s)
    finally:
        feeder.close()
        driver.stop()
    quiet = [b for b in batches if b.t_s < 0]
    bursting = [b for b in batches if b.t_s >= 0]
    return {
        "steady_s": time_to_steady(batches, 0.0, args.steady_s),
        "p50_s": quantile(after, before, 0.5),
        "p99_s": quantile(after, before, 0.99),
        "quiet_limit": quiet[-1].limit if quiet else None,
        "burst_limit": bursting[0].limit if bursting else None,
        "timeline": timeline(batches),
    }


# -- rounds and the report ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="also run the engine of this git revision")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default="cold,burst")
    parser.add_argument("--rate", type=int, default=50_000, help="cold: lines/s offered")
    parser.add_argument("--observe-s", type=float, default=120.0)
    parser.add_argument("--quiet-rate", type=float, default=100.0)
    parser.add_argument("--quiet-s", type=float, default=60.0)
    parser.add_argument("--burst-rate", type=float, default=20_000.0)
    parser.add_argument("--burst-s", type=float, default=60.0)
    parser.add_argument("--steady-s", type=float, default=2.0, help="steady p99 latency bound")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.logs = Path(tempfile.mkdtemp(prefix="bench-settle-logs-"))
    command = "python -m bench.backpressure.settle " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    engines = [Engine("this tree", ROOT)]
    if args.before:
        engines.insert(0, engine_at(args.before))
    scenarios = args.scenarios.split(",")
    broker = start_kafka() if "burst" in scenarios else None
    runs: list[dict[str, Any]] = []
    try:
        for round_ in range(1, args.rounds + 1):
            order = engines if round_ % 2 else engines[::-1]
            for scenario in scenarios:
                for engine in order:
                    runs.append(measure(scenario, engine, args, broker, round_))
                    shown = {k: v for k, v in runs[-1].items() if k != "timeline"}
                    print(json.dumps(shown), file=sys.stderr, flush=True)
    finally:
        if broker is not None:
            broker.stop()
    report = write_report(command.strip(), args, engines, runs)
    print(f"wrote {report} (the drivers' logs: {args.logs})", file=sys.stderr)
    return 0


def start_kafka() -> Any:
    from bench.throughput.kafka_input import start_broker

    return start_broker(Path(tempfile.mkdtemp(prefix="bench-kafka-")))


def measure(
    scenario: str, engine: Engine, args: argparse.Namespace, broker: Any, round_: int
) -> dict[str, Any]:
    from bench.machine import LoadMonitor, summarize_load

    label = f"{scenario}-{round_}-{'before' if engine.tree != ROOT else 'after'}"
    with LoadMonitor() as load:
        if scenario == "cold":
            figures = run_cold(engine, args, label)
        else:
            figures = run_burst(engine, args, broker, label)
    return {
        "scenario": scenario,
        "engine": engine.name,
        "round": round_,
        **figures,
        "load": summarize_load(load.samples),
    }


def seconds(value: float | None) -> str:
    if value is None:
        return "never"
    return "> 30 s" if math.isinf(value) else f"{value:.1f} s"


def rate(value: float | None) -> str:
    return "none" if value is None else f"{value:,.0f}/s"


def write_report(
    command: str, args: argparse.Namespace, engines: list[Engine], runs: list[dict[str, Any]]
) -> Path:
    from bench.machine import describe_machine, git_commit

    stem = args.out / f"{date.today().isoformat()}-backpressure"
    machine = describe_machine()
    stem.with_suffix(".json").write_text(
        json.dumps(
            {"command": command, "commit": git_commit(), "machine": machine, "runs": runs},
            indent=2,
        )
    )
    lines = [
        "# Backpressure: time to steady state",
        "",
        f"`{command}` at {git_commit()}; {machine['cores']} cores, {machine['cpu']}.",
        "",
    ]
    for scenario in dict.fromkeys(run["scenario"] for run in runs):
        mine = [run for run in runs if run["scenario"] == scenario]
        lines += [f"## {scenario}", "", *table(scenario, mine), ""]
        for engine in engines:
            steady = [r["steady_s"] for r in mine if r["engine"] == engine.name]
            reached = [s for s in steady if s is not None]
            median = statistics.median(reached) if reached else None
            lines.append(
                f"- {engine.name}: median time to steady {seconds(median)} "
                f"({len(reached)} of {len(steady)} runs reached it)"
            )
        lines.append("")
    path = stem.with_suffix(".md")
    path.write_text("\n".join(lines))
    return path


def table(scenario: str, runs: list[dict[str, Any]]) -> list[str]:
    limit_columns = (
        ("lowest limit", "lowest_limit")
        if scenario == "cold"
        else ("limit at burst", "burst_limit")
    )
    rows = [
        f"| round | engine | time to steady | p50 | p99 | {limit_columns[0]} | others' CPU |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        others = run["load"].get("others_cores_mean")
        rows.append(
            f"| {run['round']} | {run['engine']} | {seconds(run['steady_s'])} | "
            f"{seconds(run['p50_s'])} | {seconds(run['p99_s'])} | "
            f"{rate(run[limit_columns[1]])} | {others if others is not None else '?'} |"
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
