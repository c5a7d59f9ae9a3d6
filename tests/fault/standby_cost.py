"""What a standby's shadow costs per batch, measured locally (docs/fault-tolerance.md, "What
the standby costs"): the job of standby_takeover.py (faultapp on the rate source, 6 s batches,
a leader and a `dstream run --standby`, each on `local-cluster[2,1,1024]` with executors of its
own and the JVMs' JIT as `dstream run` sets it there: the executors C1 only), at `--rate`
records/s. Once the standby is warm (its shadow caught up with the leader) and a batch of the
leader ran on time, for `--batches` batches:

- at each commit of the leader, the CPU time (user + system, from /proc) of each driver's
  processes is sampled, split into the driver (its Python and its JVM), the executors'
  JVMs and the executors' Python workers. The interval between two commits holds one batch of
  the leader and the shadow of one batch on the standby (the standby's follower picks a commit
  up within 0.5 s), so each interval is what each spent on one batch; the standby's also holds
  its following (the lock polled every 0.1 s, the log read every 0.5 s), which goes on without
  a shadow too.
- from Spark's event log of each: the wall time of the batch's jobs (the first submitted to the
  last completed) and their tasks' JVM CPU time (Python's is in the workers' figure above): for
  the leader the jobs of the batch (job group `dstream-batch-<ms>`), for the standby those of
  its shadow's step of the same batch (described `standby: shadow of batch ...`, shadow.py).

Prints a JSON line per batch, then a summary line of medians (p50) and means per batch:

    .venv/bin/python tests/fault/standby_cost.py DIR [--rate N] [--batches N]

Not a test: a measurement, run by hand (about a minute to start, then one batch interval per
batch measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]  # running_driver, fault.*

from fault.standby_takeover import BATCH, STEP_TIMEOUT_S, Pair, on_time  # noqa: E402
from running_driver import Driver  # noqa: E402

ROLES = ("driver", "executors", "python workers")
TICKS = os.sysconf("SC_CLK_TCK")
LEADER_JOB = "batch "  # the leader's job description: `batch <datetime>` (scheduler.py)
SHADOW_JOB = "standby: shadow of batch "


def role_of(pid: int, sid: int, argv: list[bytes]) -> str:
    if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in argv:
        return "executors"
    if pid == sid or argv[0].endswith(b"java"):
        return "driver"
    return "python workers"  # the executors' daemons and the workers they fork


def session_cpu(sid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds so far of every process of the driver's session (its own and those of its
    children it reaped), by pid, with the process's role. The session, not the process group:
    PySpark's daemon puts itself and its workers in a group of their own."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited since the listing
        fields = stat[stat.rindex(")") + 2 :].split()  # from field 3, the state
        if int(fields[3]) != sid:
            continue
        seconds = sum(int(n) for n in fields[11:15]) / TICKS  # utime stime cutime cstime
        found[int(entry.name)] = (role_of(int(entry.name), sid, argv), seconds)
    return found


class SessionCpu:
    """A driver's processes (its session), sampled: what they spent since the previous sample,
    by role (a process that started since counts from zero; one that exited since and was not
    reaped in the session is missed, which the workers kept by Spark's worker reuse are not)."""

    def __init__(self, driver: Driver):
        self._sid = driver.pid  # started in a session of its own
        self._last = session_cpu(self._sid)

    def spent(self) -> dict[str, float]:
        now = session_cpu(self._sid)
        spent = dict.fromkeys(ROLES, 0.0)
        for pid, (role, seconds) in now.items():
            spent[role] += seconds - self._last.get(pid, (role, 0.0))[1]
        self._last = now
        return {role: round(seconds, 3) for role, seconds in spent.items()}


@dataclass
class BatchJobs:
    """The Spark jobs of one batch in one driver's event log."""

    submitted_ms: int = 2**63
    completed_ms: int = 0
    stages: set[int] = field(default_factory=set)

    def add(self, event: dict[str, Any]) -> None:
        self.submitted_ms = min(self.submitted_ms, event["Submission Time"])
        self.stages.update(event["Stage IDs"])


def event_log(app_dir: Path) -> list[dict[str, Any]]:
    """Every event of one application's rolling event log (`eventlog_v2_<app>`), in order."""
    parts = sorted(app_dir.glob("events_*"), key=lambda p: int(p.name.split("_")[1]))
    events = []
    for part in parts:
        for text in part.read_text().splitlines():
            try:
                events.append(json.loads(text))
            except json.JSONDecodeError:
                break  # the last line of a log cut short
    return events


def jobs_by_batch(events_dir: Path, prefix: str) -> dict[str, dict[str, float]]:
    """Per batch (its time of day, HH:MM:SS), the jobs described `<prefix><datetime>` in the
    event logs: their wall time (first submitted to last completed), their tasks' JVM CPU time
    and run time, in seconds."""
    figures: dict[str, dict[str, float]] = {}
    for app_dir in sorted(events_dir.glob("eventlog_v2_*")):
        batches: dict[str, BatchJobs] = defaultdict(BatchJobs)
        job_batch: dict[int, str] = {}
        cpu_ns: dict[int, int] = defaultdict(int)
        run_ms: dict[int, int] = defaultdict(int)
        for event in event_log(app_dir):
            kind = event["Event"]
            if kind == "SparkListenerJobStart":
                description = event.get("Properties", {}).get("spark.job.description") or ""
                if description.startswith(prefix):
                    key = description.removeprefix(prefix)[-8:]
                    job_batch[event["Job ID"]] = key
                    batches[key].add(event)
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_batch:
                jobs = batches[job_batch[event["Job ID"]]]
                jobs.completed_ms = max(jobs.completed_ms, event["Completion Time"])
            elif kind == "SparkListenerTaskEnd" and event.get("Task Metrics"):
                metrics = event["Task Metrics"]
                cpu_ns[event["Stage ID"]] += (
                    metrics["Executor CPU Time"] + metrics["Executor Deserialize CPU Time"]
                )
                run_ms[event["Stage ID"]] += metrics["Executor Run Time"]
        for key, jobs in batches.items():
            if jobs.completed_ms:
                figures[key] = {
                    "jobs_wall": round((jobs.completed_ms - jobs.submitted_ms) / 1000, 3),
                    "task_cpu": round(sum(cpu_ns[s] for s in jobs.stages) / 1e9, 3),
                    "task_time": round(sum(run_ms[s] for s in jobs.stages) / 1000, 3),
                }
    return figures


def measure(leader: Driver, standby: Driver, batches: int) -> list[dict[str, Any]]:
    """Sample both drivers' processes at each of the leader's next `batches` commits: per batch,
    its time of day, the leader's processing time and each one's CPU since the commit
    before."""
    groups = {"leader": SessionCpu(leader), "standby": SessionCpu(standby)}
    after = len(leader.lines)
    measured = []
    for _ in range(batches):
        line = leader.wait_for_line(lambda text: bool(BATCH.search(text)), STEP_TIMEOUT_S, after)
        spent = {name: group.spent() for name, group in groups.items()}
        after = leader.lines.index(line, after) + 1
        found = BATCH.search(line.text)
        assert found is not None
        measured.append(
            {"batch": found.group(1), "processing": float(found.group(2)), "cpu": spent}
        )
    return measured


def summary(rows: list[dict[str, Any]], rate: int) -> dict[str, Any]:
    """Medians and means per batch of every figure of the rows."""

    def stats(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(statistics.median(values), 3),
            "mean": round(statistics.fmean(values), 3),
        }

    result: dict[str, Any] = {"rate": rate, "batches": len(rows)}
    for side in ("leader", "standby"):
        figures = [row[side] for row in rows]
        result[side] = {
            name: stats([f[name] for f in figures if name in f])
            for name in ("jobs_wall", "task_cpu", "task_time")
            if any(name in f for f in figures)
        }
        cpu = [row["cpu"][side] for row in rows]
        result[side]["cpu"] = {role: stats([c[role] for c in cpu]) for role in ROLES}
        result[side]["cpu"]["total"] = stats([sum(c.values()) for c in cpu])
    result["leader"]["processing"] = stats([row["processing"] for row in rows])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a directory for the job, its logs and events")
    parser.add_argument("--rate", type=int, default=100, help="records/s of the rate source")
    parser.add_argument("--batches", type=int, default=20, help="batches measured")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    pair = Pair(args.root, rate=args.rate)
    try:
        leader = pair.start()
        leader.wait_for_line(lambda text: "leading checkpoint" in text, STEP_TIMEOUT_S)
        standby = pair.start("--standby")
        warm = standby.wait_for_line(lambda text: "standby: warm" in text, STEP_TIMEOUT_S)
        if "shadowed up to" not in warm.text:
            raise SystemExit(f"the standby is warm without a shadow to measure: {warm.text}")
        leader.wait_for_line(on_time, STEP_TIMEOUT_S, after=len(leader.lines))
        load_before = os.getloadavg()[0]
        rows = measure(leader, standby, args.batches)
        load_after = os.getloadavg()[0]
        for driver in (standby, leader):  # a graceful stop closes the event logs
            driver.terminate(timeout_s=120)
    finally:
        pair.kill_all()
    events = args.root / "events"
    leader_jobs = jobs_by_batch(events, LEADER_JOB)
    shadow_jobs = jobs_by_batch(events, SHADOW_JOB)
    for row in rows:
        row["leader"] = leader_jobs.get(row["batch"], {})
        row["standby"] = shadow_jobs.get(row["batch"], {})
        print(json.dumps(row), flush=True)
    result = summary(rows, args.rate)
    result["load1"] = [round(load_before, 1), round(load_after, 1)]
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
