"""Recovery experiments on WordCount (the stateful workload), each system at half of its own
confirmed maximum (its tuned or expert variant): the driver killed and restarted from its
checkpoint, with `local[2]` and with `local-cluster[2,1,1024]` (separate executor JVMs), and one
executor JVM of a local-cluster killed.

Each run is a `python -m bench.recovery subject` process (subject.py); its batches are read as
they complete. A batch's delay is its end minus the end of its input interval (for Structured
Streaming's `rate` source: minus the end of the newest second it read). Reported per system
and fault:
- baseline: median delay of the batches before the fault;
- peak: the largest delay after it;
- recovery: seconds from the fault until the delay is back within RECOVERED_MS of the baseline
  for good (the batches after the fault have caught up);
- on schedule: the same with the looser bound of the baseline plus one batch interval: from
  then on the job keeps its schedule, though the delay the fault added may still be draining.

`python -m bench` runs every fault for every system after its searches (`run_recovery`);
`python -m bench.recovery fault` runs one fault against one subject and prints its summary.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import DAEMONS, kill_group, start_process
from bench.recovery.cpu import Sample, Sampler, Spent, medians, spent
from bench.recovery.subject import kill_gap
from bench.throughput.systems import SYSTEM_CLASSES

RECOVERED_MS = 500
BEFORE = 30  # batches before the fault (the first ones drain the start-up backlog)
AFTER = 60  # batches run after it: a windowed DStream recomputes the window's leaving
# batches for one window length (30 batches) after a driver restart, then drains its backlog
LOCAL_CLUSTER = "local-cluster[2,1,1024]"


@dataclass(frozen=True)
class Subject:
    """Who recovers: a system's variant on a worker daemon, at a rate, with Spark settings on
    top of the shared ones (`conf`, KEY=VALUE), the driver's Spark log level and the batch
    interval (a window is WINDOW_BATCHES of them)."""

    system: str
    variant: str
    daemon: str
    rate: int
    conf: tuple[str, ...] = ()
    log_level: str = "ERROR"
    batch_ms: int = 1000


def recover_command(
    subject: Subject, checkpoint: str, batches: int, master: str, *extra: str
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "bench.recovery",
        "subject",
        "--system",
        subject.system,
        "--variant",
        subject.variant,
        "--daemon",
        subject.daemon,
        "--master",
        master,
        "--rate",
        str(subject.rate),
        "--checkpoint",
        checkpoint,
        "--batches",
        str(batches),
        "--log-level",
        subject.log_level,
        "--batch-ms",
        str(subject.batch_ms),
        *(arg for setting in subject.conf for arg in ("--conf", setting)),
        *extra,
    ]


class RecoverProcess:
    """A running subject process (subject.py) in its own process group, its events collected
    by a thread."""

    def __init__(self, command: list[str], log_name: str):
        self.process = start_process(command, log_name)
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def batches(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "batch"]

    def wait_for_batches(self, count: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if len(self.batches()) >= count:
                return True
            time.sleep(0.2)
        return len(self.batches()) >= count

    def kill(self) -> int:
        """SIGKILL the whole process group (driver, JVM, Python workers): a lost driver pod."""
        killed_ms = int(time.time() * 1000)
        kill_group(self.process)
        self._reader.join(timeout=5)
        return killed_ms

    def finish(self, timeout_s: float) -> None:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        self.kill()


def summarize(
    before: list[dict[str, Any]], after: list[dict[str, Any]], fault_ms: int, batch_ms: int
) -> dict:
    """Baseline, peak, recovery and on-schedule time (see the module docstring) from batch
    events."""

    def delay(b: dict[str, Any]) -> int:
        return b["end_ms"] - b["time_ms"]

    steady = before[-10:]
    baseline = statistics.median(delay(b) for b in steady) if steady else 0.0
    later = sorted((b for b in after if b["end_ms"] >= fault_ms), key=lambda b: b["end_ms"])
    if not later:
        return {
            "baseline_ms": baseline,
            "recovered": False,
            "recovery_s": None,
            "on_schedule_s": None,
        }

    def for_good(bound: float) -> float | None:
        """Seconds from the fault to the end of the first batch from which on every delay is
        within `bound`: the one after the last batch over it."""
        late = [i for i, b in enumerate(later) if delay(b) > bound]
        first = late[-1] + 1 if late else 0
        return (later[first]["end_ms"] - fault_ms) / 1000 if first < len(later) else None

    recovery_s = for_good(baseline + RECOVERED_MS)
    return {
        "baseline_ms": baseline,
        "peak_ms": max(delay(b) for b in later),
        "first_batch_after_s": (later[0]["end_ms"] - fault_ms) / 1000,
        "recovery_s": recovery_s,
        "recovered": recovery_s is not None,
        "on_schedule_s": for_good(baseline + batch_ms),
        "timeline": [
            {"t_s": (b["end_ms"] - fault_ms) / 1000, "delay_ms": delay(b)}
            for b in sorted(before + later, key=lambda b: b["end_ms"])
        ],
    }


def executor_kill(
    subject: Subject,
    kills: int = 1,
    every: int = AFTER,
    master: str = LOCAL_CLUSTER,
    cpu: bool = False,
) -> dict[str, Any]:
    """Executor JVMs of a local-cluster killed in turn, the first once the job is on schedule
    after BEFORE batches, each later one once it is again and at least `every` batches after
    the one before (subject.py); one kill's summary, or with several, each one's and their
    percentiles. With `cpu`, each kill's CPU-seconds per role up to its recovery (cpu.py)."""
    checkpoint = tempfile.mkdtemp(prefix=f"bench-recovery-{subject.system}-")
    extra = (
        "--kill-executor-after",
        str(BEFORE),
        "--kills",
        str(kills),
        "--kill-every",
        str(every),
    )
    batches = BEFORE + sum(kill_gap(every, kill) for kill in range(kills))
    command = recover_command(subject, checkpoint, batches, master, *extra)
    run = RecoverProcess(command, f"recovery-executor-{subject.system}.log")
    sampler = Sampler(run.process.pid) if cpu else None
    try:
        run.finish(timeout_s=6 * 4 * batches * subject.batch_ms / 1000 + 120)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    samples = sampler.stop() if sampler else []
    killed = [e["ms"] for e in run.events if e["event"] == "killed" and e.get("pid") is not None]
    if len(killed) < kills:
        return {"error": f"{len(killed)} of {kills} executors killed (see the log)"}
    batches_run = run.batches()
    ends = [*killed[1:], None]
    each = [
        summarize(
            [b for b in batches_run if previous <= b["end_ms"] < fault_ms],
            [
                b
                for b in batches_run
                if fault_ms <= b["end_ms"] and (end is None or b["end_ms"] < end)
            ],
            fault_ms,
            subject.batch_ms,
        )
        for previous, fault_ms, end in zip([0, *killed[:-1]], killed, ends, strict=True)
    ]
    if cpu:
        add_cpu(each, killed, ends, samples)
    return each[0] if kills == 1 else percentiles(each, subject.batch_ms)


def add_cpu(
    each: list[dict[str, Any]], killed: list[int], ends: list[int | None], samples: list[Sample]
) -> None:
    """Each kill's CPU-seconds per role, from the kill to its recovery (or to the next kill)."""
    for kill, fault_ms, end in zip(each, killed, ends, strict=True):
        if kill.get("recovered"):
            until = fault_ms / 1000 + kill["recovery_s"]
        elif end is not None:
            until = end / 1000
        else:
            until = samples[-1].t if samples else 0.0
        read = spent(samples, fault_ms / 1000, until)
        kill["cpu"] = None if read is None else asdict(read)


def nearest_rank(values: list[float | None], share: float) -> float | None:
    """The `share` percentile by nearest rank, a missing value (not seen before the next kill)
    counting as the longest; None when the rank falls on one."""
    ordered = sorted(float("inf") if v is None else v for v in values)
    value = ordered[math.ceil(share * len(ordered)) - 1]
    return None if value == float("inf") else value


def percentiles(each: list[dict[str, Any]], batch_ms: int) -> dict[str, Any]:
    """p50 and p90 of the recovery and on-schedule times over several kills, a recovery not
    seen before the next kill counting as the longest; in seconds and in batch intervals, the
    kills listed."""
    recovered = [k["recovery_s"] for k in each if k.get("recovered")]
    times = [k["recovery_s"] if k.get("recovered") else None for k in each]
    on_time = [k.get("on_schedule_s") for k in each]
    p50, p90 = nearest_rank(times, 0.5), nearest_rank(times, 0.9)
    on_p50 = nearest_rank(on_time, 0.5)
    return {
        "kills": len(each),
        "recovered": len(recovered),
        "recovery_p50_s": p50,
        "recovery_p90_s": p90,
        "recovery_p50_intervals": None if p50 is None else p50 * 1000 / batch_ms,
        "on_schedule_p50_s": on_p50,
        "on_schedule_p90_s": nearest_rank(on_time, 0.9),
        "on_schedule_p50_intervals": None if on_p50 is None else on_p50 * 1000 / batch_ms,
        "baseline_ms": statistics.median(k["baseline_ms"] for k in each),
        "peak_p50_ms": statistics.median(k.get("peak_ms", 0) for k in each),
        "each": [{key: v for key, v in k.items() if key != "timeline"} for k in each],
        **cpu_medians(each),
    }


def cpu_medians(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The kills' median CPU-seconds per role, where they were read."""
    read = [Spent(**k["cpu"]) for k in each if k.get("cpu")]
    return {"cpu_p50": medians(read)} if read else {}


def driver_restart(subject: Subject, master: str) -> dict[str, Any]:
    """The driver's process group SIGKILLed after BEFORE batches, then started again."""
    checkpoint = tempfile.mkdtemp(prefix=f"bench-recovery-{subject.system}-")
    name = f"recovery-driver-{subject.system}-{master.split('[')[0]}"
    try:
        first = RecoverProcess(
            recover_command(subject, checkpoint, 10_000, master), f"{name}-1.log"
        )
        if not first.wait_for_batches(BEFORE, timeout_s=4 * BEFORE + 120):
            first.kill()
            return {"error": "the first run did not complete its batches (see the log)"}
        fault_ms = first.kill()
        second = RecoverProcess(
            recover_command(subject, checkpoint, AFTER, master), f"{name}-2.log"
        )
        second.finish(timeout_s=6 * AFTER + 120)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if not second.batches():
        return {"error": "the restarted driver completed no batch (see the log)"}
    return summarize(first.batches(), second.batches(), fault_ms, subject.batch_ms)


FAULTS = ("driver, local[2]", f"driver, {LOCAL_CLUSTER}", f"executor, {LOCAL_CLUSTER}")


def run_faults(subject: Subject) -> dict[str, Any]:
    return {
        FAULTS[0]: driver_restart(subject, "local[2]"),
        FAULTS[1]: driver_restart(subject, LOCAL_CLUSTER),
        FAULTS[2]: executor_kill(subject),
    }


def recovery_subject(system: str, table: dict[str, Any], daemon: str) -> Subject | None:
    """The system's best variant with a confirmed WordCount maximum, at half of it."""
    for variant in reversed(SYSTEM_CLASSES[system].variants):  # tuned / expert first
        row = table.get("wordcount", {}).get(f"{system}/{variant}", {})
        if row.get("status") == "confirmed" and row.get("rate"):
            return Subject(system, variant, daemon, max(100, row["rate"] // 2))
    return None


def run_recovery(systems: list[str], table: dict[str, Any], daemon: str) -> dict[str, Any]:
    results: dict[str, Any] = {
        "workload": "wordcount",
        "daemon": daemon,
        "batches_before": BEFORE,
        "batches_after": AFTER,
    }
    for system in systems:
        subject = recovery_subject(system, table, daemon)
        if subject is None:
            results[system] = {"skipped": "no confirmed WordCount maximum to take half of"}
            continue
        print(
            f"  recovery: {system}/{subject.variant} at {subject.rate:,}/s",
            file=sys.stderr,
            flush=True,
        )
        results[system] = {"variant": subject.variant, "rate": subject.rate, **run_faults(subject)}
    return results


def main(argv: list[str] | None = None) -> int:
    """One fault against one subject (a system's variant at a rate), its summary printed."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--system", choices=list(SYSTEM_CLASSES), default="dstream")
    parser.add_argument("--variant", default="tuned")
    parser.add_argument("--daemon", choices=DAEMONS, default=DAEMONS[0])
    parser.add_argument("--rate", type=int, required=True, help="lines per second")
    parser.add_argument("--fault", choices=FAULTS, default=FAULTS[0])
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the subject, over the shared ones (repeatable): A/B runs",
    )
    parser.add_argument(
        "--kills", type=int, default=1, help="executor fault: executors killed in turn"
    )
    parser.add_argument(
        "--kill-every", type=int, default=20, help="executor fault: batches at least between kills"
    )
    parser.add_argument(
        "--log-level", default="ERROR", help="the subject driver's Spark log level (its log)"
    )
    parser.add_argument(
        "--batch-ms", type=int, default=1000, help="the batch interval (a slower machine)"
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="executor fault: each kill's CPU-seconds per process role up to its recovery",
    )
    parser.add_argument(
        "--master",
        help="the fault's cluster in another layout, e.g. local-cluster[2,2,1024] (its maximum "
        "measured in that layout)",
    )
    args = parser.parse_args(argv)
    variants = SYSTEM_CLASSES[args.system].variants
    if args.variant not in variants:
        parser.error(f"--variant {args.variant}: {args.system} has {', '.join(variants)}")
    subject = Subject(
        args.system,
        args.variant,
        args.daemon,
        args.rate,
        tuple(args.conf),
        args.log_level,
        args.batch_ms,
    )
    kind, master = args.fault.split(", ")
    if args.master:
        if args.master.startswith("local-cluster[") != master.startswith("local-cluster["):
            parser.error(f"--master {args.master}: the fault {args.fault!r} runs on {master}")
        master = args.master
    if kind == "driver":
        result = driver_restart(subject, master)
    else:
        every = args.kill_every if args.kills > 1 else AFTER
        result = executor_kill(subject, args.kills, every, master, args.cpu)
    print(json.dumps({k: v for k, v in result.items() if k != "timeline"}, indent=1))
    delays = (f"{b['t_s']:.1f}s:{b['delay_ms']}ms" for b in result.get("timeline", []))
    print("timeline (since the fault: delay):", " ".join(delays), file=sys.stderr)
    return 0
