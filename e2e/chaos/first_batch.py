"""`python -m e2e.chaos.first_batch DIR`: where each restarted driver's first batch went, from
the Spark event logs an e2e run wrote with `--spark-conf spark.eventLog.enabled=true
--spark-conf spark.eventLog.dir=file:///data` (DIR: the run's directory under DSTREAM_E2E_DATA).

Per driver after the first, in the order they started: when its executors registered, how many
stages its first batch ran, the time from the last registration to the end of that batch's last
job, and each executor's first task (wall time, Spark's deserialisation and run time); then the
medians over the drivers, beside a warm batch's time and stages (the third batch of each
driver on).

Spark 4 compresses event logs with zstd unless `spark.eventLog.compress=false`; compressed ones
are read through the `zstd` program.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BATCH_GROUP = "dstream-batch-"  # the engine's job group of a batch's jobs
WARM_FROM = 2  # a driver's batches from the third on are warm


@dataclass
class Batch:
    start_ms: int  # its first job's submission
    end_ms: int | None = None  # its last job's completion
    stages: int = 0
    tasks: list[dict[str, Any]] = field(default_factory=list)  # launch order


@dataclass
class Driver:
    name: str
    start_ms: int
    executors_added_ms: list[int]
    batches: list[Batch]  # in the order their first job started


def event_lines(path: Path) -> list[str]:
    if path.suffix != ".zstd":
        return path.read_text().splitlines()
    if shutil.which("zstd") is None:
        raise SystemExit(
            f"{path} is zstd-compressed: install zstd, or run with --spark-conf spark.eventLog.compress=false"
        )
    return subprocess.run(
        ["zstd", "-dcq", str(path)], check=True, capture_output=True, text=True
    ).stdout.splitlines()


def read_events(log: Path) -> list[dict[str, Any]]:
    """A driver's events: one file, or a directory of rolled ones (`eventlog_v2_*`, numbered
    `events_<n>_...`). A killed driver's last line may be cut short: it is left out."""
    if log.is_dir():
        files = sorted(
            (p for p in log.iterdir() if p.name.startswith("events_")),
            key=lambda p: int(p.name.split("_")[1]),
        )
    else:
        files = [log]
    events = []
    for path in files:
        lines = [line for line in event_lines(path) if line.strip()]
        for n, line in enumerate(lines):
            try:
                events.append(json.loads(line))
            except ValueError:
                if n < len(lines) - 1:
                    raise
    return events


def driver_of(name: str, events: list[dict[str, Any]]) -> Driver | None:
    """The driver's executors and batches, or None for a log without an application start."""
    start = next(
        (e["Timestamp"] for e in events if e["Event"] == "SparkListenerApplicationStart"), None
    )
    if start is None:
        return None
    added = [e["Timestamp"] for e in events if e["Event"] == "SparkListenerExecutorAdded"]
    batches: dict[str, Batch] = {}
    batch_of_job: dict[int, Batch] = {}
    batch_of_stage: dict[int, Batch] = {}
    for event in events:
        kind = event["Event"]
        if kind == "SparkListenerJobStart":
            group = (event.get("Properties") or {}).get("spark.jobGroup.id", "")
            if not group.startswith(BATCH_GROUP):
                continue
            batch = batches.setdefault(group, Batch(start_ms=event["Submission Time"]))
            batch_of_job[event["Job ID"]] = batch
            for stage in event["Stage Infos"]:
                batch_of_stage[stage["Stage ID"]] = batch
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in batch_of_job:
            batch_of_job[event["Job ID"]].end_ms = event["Completion Time"]
        elif kind == "SparkListenerStageCompleted":
            batch = batch_of_stage.get(event["Stage Info"]["Stage ID"])
            if batch is not None and event["Stage Info"].get("Submission Time") is not None:
                batch.stages += 1
        elif kind == "SparkListenerTaskEnd" and event["Stage ID"] in batch_of_stage:
            info, metrics = event["Task Info"], event.get("Task Metrics") or {}
            batch_of_stage[event["Stage ID"]].tasks.append(
                {
                    "executor": info["Executor ID"],
                    "wall_ms": info["Finish Time"] - info["Launch Time"],
                    "launch_ms": info["Launch Time"],
                    "deserialize_ms": metrics.get("Executor Deserialize Time", 0),
                    "run_ms": metrics.get("Executor Run Time", 0),
                }
            )
    ordered = sorted(batches.values(), key=lambda b: b.start_ms)
    return Driver(name, start, added, ordered)


def first_tasks(batch: Batch) -> list[dict[str, Any]]:
    """Each executor's first task of the batch."""
    seen: dict[str, dict[str, Any]] = {}
    for task in sorted(batch.tasks, key=lambda t: t["launch_ms"]):
        seen.setdefault(task["executor"], task)
    return list(seen.values())


def drivers_in(run: Path) -> list[Driver]:
    """Every driver that logged events under `run`, in the order they started."""
    logs = [p for p in run.iterdir() if p.name.startswith(("eventlog_v2_", "spark-", "app-"))]
    drivers = [driver_of(log.name, read_events(log)) for log in logs]
    return sorted((d for d in drivers if d is not None), key=lambda d: d.start_ms)


def report(drivers: list[Driver]) -> list[str]:
    """Lines per restarted driver, then the medians over them."""
    lines: list[str] = []
    to_end: list[float] = []
    firsts: list[dict[str, Any]] = []
    warm: list[Batch] = []
    for driver in drivers[1:]:
        if not driver.batches or driver.batches[0].end_ms is None or not driver.executors_added_ms:
            lines.append(f"{driver.name}: no first batch ended")
            continue
        first = driver.batches[0]
        since = (first.end_ms - max(driver.executors_added_ms)) / 1000
        to_end.append(since)
        tasks = first_tasks(first)
        firsts += tasks
        warm += [b for b in driver.batches[WARM_FROM:] if b.end_ms is not None]
        added = ", ".join(f"{(t - driver.start_ms) / 1000:.2f}" for t in driver.executors_added_ms)
        cold = ", ".join(
            f"{t['wall_ms'] / 1000:.2f} s ({t['deserialize_ms']} + {t['run_ms']} ms)" for t in tasks
        )
        lines.append(
            f"{driver.name}: executors registered at {added} s; first batch {first.stages} stages, "
            f"ended {since:.2f} s after the last registration; first tasks {cold}"
        )
    if to_end:
        lines.append(
            f"restarted drivers={len(to_end)} first_batch_after_registration_p50={statistics.median(to_end):.2f}s "
            f"min={min(to_end):.2f}s max={max(to_end):.2f}s"
        )
    if firsts:
        lines.append(
            f"first_task_p50={statistics.median(t['wall_ms'] for t in firsts) / 1000:.2f}s "
            f"deserialize_p50={statistics.median(t['deserialize_ms'] for t in firsts):.0f}ms "
            f"run_p50={statistics.median(t['run_ms'] for t in firsts):.0f}ms (n={len(firsts)})"
        )
    if warm:
        took = statistics.median((b.end_ms or b.start_ms) - b.start_ms for b in warm) / 1000
        stages = statistics.median(b.stages for b in warm)
        lines.append(f"warm_batch_jobs_p50={took:.2f}s stages_p50={stages:g} (n={len(warm)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.chaos.first_batch", description=__doc__)
    parser.add_argument("run", type=Path, help="the e2e run's directory (event logs in it)")
    args = parser.parse_args(argv)
    drivers = drivers_in(args.run)
    if len(drivers) < 2:
        parser.error(f"{args.run} holds {len(drivers)} driver event log(s): no restart to read")
    print("\n".join(report(drivers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
