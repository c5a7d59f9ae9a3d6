"""`python -m bench.throughput profile`: where a DStream engine's batch time goes, from Spark's
event log.

Runs one workload variant of `programs` on dstream or pyspark.streaming (`local[2]`, the
chosen worker daemon) at a fixed rate and batch interval (`--batch-interval`) with Spark's event
log on, then prints per batch: its scheduling delay, processing time, the p99 end-to-end
latency of its records, the Spark jobs, stages and tasks it ran (by its batch time), how much of
the processing time some job was running, the tasks' executor run time and (dstream) the time
spent writing its batch record and commit marker; then the medians
over the batches after the window filled. Processing time not covered by any job is the
driver's own per-batch cost (planning, py4j calls, checkpoint writes). Run py-spy on the
printed driver pid for the driver's Python side.

`--stages` also prints, per stage name (Spark's call site of the stage's last RDD), the medians
over the same batches of the stages that ran and their time: wall time, the tasks' run time, the
scheduler's delay (a task's time neither deserializing, running nor sending its result: waiting
for a core or for locality), the shuffle fetch wait, and the tasks' locality levels. Two runs'
tables side by side show which stage a change made slower.

`--source kafka` reads the rate from a topic fed on a broker it starts (as a `--source kafka` trial
does) instead of the rate source: what a batch costs the engine's Kafka source.

`--py4j` counts the driver's py4j round trips per batch and prints their median and the call
sites that made them (`py4j_calls`); counting slows the driver, so take times from a run
without it.

`--zipcache` gives every Python worker `dstream.worker.zipcache` from the start (a sitecustomize
module), as importing the dstream package gives dstream's own workers: on `pyspark.daemon` that
separates what the zip cache buys from what the engine does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark import SparkContext

from bench.common import DAEMONS, ENGINES, PARTITIONS, WORKER_MODULES, spark_conf
from bench.throughput.kafka_input import KafkaFeed, start_broker
from bench.throughput.py4j_calls import Py4JCalls
from bench.throughput.reference import WINDOW_BATCHES
from bench.throughput.systems import SYSTEM_CLASSES, Batch

# The job property that names a job's batch: dstream's job group, Spark Streaming's batch time.
DSTREAM_GROUP = "dstream-batch-"
STREAMING_BATCH_TIME = "spark.streaming.internal.batchTime"
ZIPCACHE = WORKER_MODULES / "zipcache.py"


def give_workers_zipcache() -> None:
    """Every Python process started from now on loads dstream.worker.zipcache by its file (not the
    dstream package, whose import would change more) and installs it."""
    directory = tempfile.mkdtemp(prefix="bench-zipcache-")
    Path(directory, "sitecustomize.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('bench_zipcache', {str(ZIPCACHE)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "module.reread_zips_only_when_changed()\n"
    )
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (directory, os.environ.get("PYTHONPATH", "")) if p
    )


def run(
    system: str,
    daemon: str,
    workload: str,
    variant: str,
    rate: int,
    batches: int,
    log_dir: str,
    batch_ms: int = 1000,
    source: str = "rate",
    on_batch: Callable[[Batch], None] | None = None,
) -> list[Batch]:
    conf = spark_conf("local[2]", PARTITIONS, daemon)
    conf.setAll(event_log_conf(log_dir))
    broker = (
        start_broker(Path(tempfile.mkdtemp(prefix="bench-kafka-"))) if source == "kafka" else None
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    print(f"driver pid {os.getpid()}", file=sys.stderr, flush=True)
    try:
        feed = KafkaFeed(broker.bootstrap, PARTITIONS) if broker is not None else None
        tested = SYSTEM_CLASSES[system](sc, PARTITIONS, feed)
        tested.on_batch = on_batch
        trial = tested.run(
            workload, variant, rate, 0, batches, timeout_s=3 * batches + 60, batch_ms=batch_ms
        )
    finally:
        sc.stop()
        if broker is not None:
            broker.stop()
    return trial.batches


def event_log_conf(log_dir: str) -> list[tuple[str, str]]:
    """Spark's event log, one uncompressed file in log_dir: what `read_events` reads."""
    return [
        ("spark.eventLog.enabled", "true"),
        ("spark.eventLog.dir", log_dir),
        ("spark.eventLog.compress", "false"),
        ("spark.eventLog.rolling.enabled", "false"),
    ]


def read_events(log_dir: str) -> list[dict[str, Any]]:
    """Every event of the run (one uncompressed event file, or a directory of rolled ones)."""
    files = sorted(p for p in Path(log_dir).rglob("*") if p.is_file() and p.stat().st_size)
    files = [p for p in files if not p.name.startswith((".", "appstatus"))]
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def batch_of(properties: dict[str, str]) -> int | None:
    """The batch time (ms) a job ran for, by either engine's job properties."""
    group = properties.get("spark.jobGroup.id", "")
    if group.startswith(DSTREAM_GROUP):
        return int(group[len(DSTREAM_GROUP) :])
    value = properties.get(STREAMING_BATCH_TIME)
    return int(value) if value else None


def jobs_by_batch(
    events: list[dict[str, Any]],
    batch_of: Callable[[dict[str, str]], int | None] = batch_of,
) -> dict[int, list[dict[str, Any]]]:
    """Per batch (its time, or what `batch_of` reads from a job's properties): each job's
    start, end, stages, tasks, task run time and task CPU time."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            batch = batch_of(e.get("Properties") or {})
            jobs[e["Job ID"]] = {"batch": batch, "start": e["Submission Time"], "stages": 0}
            for stage in e["Stage IDs"]:
                stage_job[stage] = e["Job ID"]
        elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
            jobs[e["Job ID"]]["end"] = e["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            job = jobs.get(stage_job.get(e["Stage Info"]["Stage ID"], -1))
            if job is not None:
                job["stages"] += 1
        elif kind == "SparkListenerTaskEnd":
            job = jobs.get(stage_job.get(e["Stage ID"], -1))
            if job is not None:
                job["tasks"] = job.get("tasks", 0) + 1
                metrics = e.get("Task Metrics") or {}
                job["run_ms"] = job.get("run_ms", 0) + metrics.get("Executor Run Time", 0)
                cpu_ms = metrics.get("Executor CPU Time", 0) // 1_000_000
                job["cpu_ms"] = job.get("cpu_ms", 0) + cpu_ms
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for job in jobs.values():
        if job["batch"] is not None:
            grouped[job["batch"]].append(job)
    return grouped


def stages_by_batch(
    events: list[dict[str, Any]],
    batch_of: Callable[[dict[str, str]], int | None] = batch_of,
) -> dict[int, list[dict[str, Any]]]:
    """Per batch, each stage its jobs ran (skipped stages have no completion): its name,
    tasks, wall time, the tasks' run time, scheduler delay and fetch wait, and their localities."""
    batch_of_stage: dict[int, int | None] = {}
    stages: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            batch = batch_of(e.get("Properties") or {})
            batch_of_stage.update((stage, batch) for stage in e["Stage IDs"])
        elif kind == "SparkListenerTaskEnd" and e["Stage ID"] in batch_of_stage:
            stage = stages.setdefault(e["Stage ID"], new_stage())
            add_task(stage, e["Task Info"], e.get("Task Metrics") or {})
        elif kind == "SparkListenerStageCompleted":
            info = e["Stage Info"]
            stage = stages.setdefault(info["Stage ID"], new_stage())
            stage["name"] = info["Stage Name"]
            stage["wall"] = info.get("Completion Time", 0) - info.get("Submission Time", 0)
    grouped: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for stage_id, stage in stages.items():
        batch = batch_of_stage.get(stage_id)
        if batch is not None and "name" in stage:
            grouped[batch].append(stage)
    return grouped


def new_stage() -> dict[str, Any]:
    return {"tasks": 0, "run": 0, "sched": 0, "fetch": 0, "locality": defaultdict(int)}


def add_task(stage: dict[str, Any], info: dict[str, Any], metrics: dict[str, Any]) -> None:
    """One finished task's times into its stage's sums."""
    run = metrics.get("Executor Run Time", 0)
    overhead = metrics.get("Executor Deserialize Time", 0) + metrics.get(
        "Result Serialization Time", 0
    )
    span = info.get("Finish Time", 0) - info.get("Launch Time", 0)
    stage["tasks"] += 1
    stage["run"] += run
    stage["sched"] += max(0, span - run - overhead - info.get("Getting Result Time", 0))
    stage["fetch"] += (metrics.get("Shuffle Read Metrics") or {}).get("Fetch Wait Time", 0)
    stage["locality"][info.get("Locality", "?")] += 1


STAGE_COLUMNS = ("count", "tasks", "wall", "run", "sched", "fetch")


def print_stage_medians(per_batch: list[list[dict[str, Any]]]) -> None:
    """Per stage name, the medians over the batches (0 where a batch ran no such stage)."""
    names = sorted({stage["name"] for stages in per_batch for stage in stages})
    print("stage medians over the same batches: " + " ".join(f"{c:>7}" for c in STAGE_COLUMNS))
    for name in names:
        sums = []
        localities: dict[str, int] = defaultdict(int)
        for stages in per_batch:
            mine = [s for s in stages if s["name"] == name]
            row = {c: sum(s[c] for s in mine) for c in STAGE_COLUMNS if c != "count"}
            sums.append({**row, "count": len(mine)})
            for s in mine:
                for level, n in s["locality"].items():
                    localities[level] += n
        medians = " ".join(f"{statistics.median(r[c] for r in sums):>7g}" for c in STAGE_COLUMNS)
        print(f"  {name[-60:]:60} {medians}  {dict(localities)}")


def covered_ms(jobs: list[dict[str, Any]]) -> int:
    """Milliseconds during which at least one of the jobs ran."""
    spans = sorted((j["start"], j.get("end", j["start"])) for j in jobs)
    total, reach = 0, None
    for start, end in spans:
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


COLUMNS = (
    "delay",
    "processing",
    "latency_p99",
    "jobs",
    "stages",
    "tasks",
    "in_jobs",
    "task_run",
    "checkpoint",
)


def batch_row(batch: Batch, jobs: list[dict[str, Any]]) -> dict[str, float]:
    return {
        "delay": batch.scheduling_ms,
        "processing": batch.processing_ms,
        "latency_p99": round(batch.latency_p99_ms or 0),
        "checkpoint": round(batch.checkpoint_ms or 0),
        "jobs": len(jobs),
        "stages": sum(j["stages"] for j in jobs),
        "tasks": sum(j.get("tasks", 0) for j in jobs),
        "in_jobs": covered_ms(jobs),
        "task_run": sum(j.get("run_ms", 0) for j in jobs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=ENGINES, default="dstream")
    parser.add_argument("--daemon", choices=DAEMONS, default="dstream.worker.pydaemon")
    parser.add_argument("--workload", default="wordcount")
    parser.add_argument("--variant", default="tuned")
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=45)
    parser.add_argument("--batch-interval", type=int, default=1000, metavar="MS")
    parser.add_argument("--source", choices=("rate", "kafka"), default="rate")
    parser.add_argument("--stages", action="store_true", help="per stage name, its medians")
    parser.add_argument("--py4j", action="store_true", help="count py4j round trips per batch")
    parser.add_argument(
        "--zipcache", action="store_true", help="dstream.worker.zipcache in all workers"
    )
    args = parser.parse_args(argv)
    if args.zipcache:
        give_workers_zipcache()
    log_dir = tempfile.mkdtemp(prefix="bench-eventlog-")
    calls = Py4JCalls()
    with calls if args.py4j else contextlib.nullcontext():
        batches = run(
            args.system,
            args.daemon,
            args.workload,
            args.variant,
            args.rate,
            args.batches,
            log_dir,
            args.batch_interval,
            args.source,
            calls.batch_completed if args.py4j else None,
        )
    events = read_events(log_dir)
    grouped = jobs_by_batch(events)
    rows = [batch_row(b, grouped.get(b.time_ms, [])) for b in batches]
    print("batch  " + " ".join(f"{c:>10}" for c in COLUMNS))
    for batch, row in zip(batches, rows, strict=True):
        print(f"{batch.time_ms % 100_000:>6} " + " ".join(f"{row[c]:>10}" for c in COLUMNS))
    filling = WINDOW_BATCHES * 1000 // args.batch_interval  # the batches before the window is full
    steady = rows[filling:] or rows
    medians = {c: statistics.median(r[c] for r in steady) for c in COLUMNS}
    print(f"median of the last {len(steady)} " + " ".join(f"{medians[c]:>10g}" for c in COLUMNS))
    if args.stages:
        by_batch = stages_by_batch(events)
        print_stage_medians([by_batch.get(b.time_ms, []) for b in batches[filling:] or batches])
    if args.py4j:
        calls.report(skip=filling)
    return 0
