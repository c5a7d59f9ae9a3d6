"""`python -m bench.profile`: where a dstream batch's time goes, from Spark's own event log.

Runs one workload variant of `bench.programs` on dstream (`local[2]`, dstream.pydaemon) at a
fixed rate with Spark's event log on, then prints per batch: its processing time, the Spark
jobs, stages and tasks it ran (by the batch's job group), how much of the processing time some
job was running, the tasks' executor run time and the batch log's write time. Processing time
not covered by any job is the driver's own per-batch cost (planning, py4j calls, checkpoint
writes). Run py-spy on the printed driver pid for the driver's Python side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from pyspark import SparkContext

from bench import programs
from bench.reference import RECORD_BYTES, SEED
from bench.systems import spark_conf


def run(workload: str, variant: str, rate: int, batches: int, log_dir: str) -> list[Any]:
    from dstream import StreamingContext

    conf = spark_conf("local[2]", 2, "dstream.pydaemon")
    conf.setAll(
        [
            ("spark.eventLog.enabled", "true"),
            ("spark.eventLog.dir", log_dir),
            ("spark.eventLog.compress", "false"),
            ("spark.eventLog.rolling.enabled", "false"),
        ]
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    print(f"driver pid {os.getpid()}", file=sys.stderr, flush=True)
    infos: list[Any] = []
    try:
        ssc = StreamingContext(sc, 1)
        ssc.checkpoint(tempfile.mkdtemp(prefix="bench-profile-"))
        programs.build(workload, variant, ssc.rateStream(rate, 2, SEED, RECORD_BYTES))

        class Collector:
            def onBatchCompleted(self, event: Any) -> None:
                infos.append(event.batchInfo())

        ssc.addStreamingListener(Collector())
        ssc.start()
        deadline = time.monotonic() + 3 * batches + 60
        while len(infos) < batches and time.monotonic() < deadline:
            time.sleep(0.5)
        ssc.stop(stopSparkContext=False)
    finally:
        sc.stop()
    return infos


def read_events(log_dir: str) -> list[dict[str, Any]]:
    """Every event of the run (one uncompressed event file, or a directory of rolled ones)."""
    files = sorted(p for p in Path(log_dir).rglob("*") if p.is_file() and p.stat().st_size)
    files = [p for p in files if not p.name.startswith((".", "appstatus"))]
    return [json.loads(line) for path in files for line in path.read_text().splitlines()]


def jobs_by_group(events: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per job group: each job's start, end, stage count, tasks and executor run time."""
    jobs: dict[int, dict[str, Any]] = {}
    stage_job: dict[int, int] = {}
    for e in events:
        kind = e["Event"]
        if kind == "SparkListenerJobStart":
            group = (e.get("Properties") or {}).get("spark.jobGroup.id", "")
            jobs[e["Job ID"]] = {"group": group, "start": e["Submission Time"], "stages": 0}
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
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in jobs.values():
        grouped[job["group"]].append(job)
    return grouped


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="wordcount")
    parser.add_argument("--variant", default="tuned")
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args(argv)
    log_dir = tempfile.mkdtemp(prefix="bench-eventlog-")
    infos = run(args.workload, args.variant, args.rate, args.batches, log_dir)
    grouped = jobs_by_group(read_events(log_dir))
    print("batch  processing  jobs stages tasks  in-jobs  task-run  batch-log")
    for info in infos:
        jobs = grouped.get(f"dstream-batch-{info.batch_time_ms}", [])
        print(
            f"{info.batch_time_ms % 100_000:>6} {info.processingDelay():>8} ms "
            f"{len(jobs):>4} {sum(j['stages'] for j in jobs):>6} "
            f"{sum(j.get('tasks', 0) for j in jobs):>5} {covered_ms(jobs):>6} ms "
            f"{sum(j.get('run_ms', 0) for j in jobs):>6} ms "
            f"{(info.checkpoint_seconds or 0) * 1000:>7.0f} ms"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
