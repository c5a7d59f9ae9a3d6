"""`python -m bench`: every system, side by side on this machine, and the report.

`--quick` (make bench-quick, a few minutes) runs short searches and prints one line per workload
with the throughput ratios of dstream to each peer. The full run (make bench) searches with more
and longer trials, confirms each maximum over 30+ batches, measures latency at half of it, runs
the recovery experiments, and writes bench/results/<date>.md, a JSON file and PNG plots.
Systems run one after the other (never concurrently: the machine has 2 cores), each in its own
worker process whose memory is sampled.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.machine import describe_machine, load_average, wait_for_quiet
from bench.memory import MemorySampler
from bench.systems import SYSTEMS, WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def previous_rates() -> dict[str, dict[str, int]]:
    """{system: {workload: rate}} from the newest committed full run, to start searches near."""
    found = sorted(RESULTS.glob("*.json"))
    if not found:
        return {}
    table = json.loads(found[-1].read_text()).get("table", {})
    rates: dict[str, dict[str, int]] = {}
    for workload, systems in table.items():
        for system, row in systems.items():
            if row.get("rate"):
                rates.setdefault(system, {})[workload] = int(row["rate"])
    return rates


def run_worker(system: str, plan: str, workloads: list[str], extra: list[str]) -> dict[str, Any]:
    """One system's worker process; returns its events and the memory peaks per phase."""
    command = [
        sys.executable,
        "-m",
        "bench.worker",
        "--system",
        system,
        "--plan",
        plan,
        "--workloads",
        ",".join(workloads),
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log_path = RESULTS / "logs" / f"{system}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    events: list[dict[str, Any]] = []
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        sampler = MemorySampler(worker.pid).start()
        try:
            assert worker.stdout is not None
            for line in worker.stdout:
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                events.append(event)
                if event["event"] == "phase":
                    sampler.label = f"{event['workload']}/{event['phase']}"
                print_progress(system, event)
            worker.wait()
        finally:
            sampler.stop()
            kill_group(worker)
    return {"events": events, "memory": dict(sampler.peaks), "returncode": worker.returncode}


def kill_group(process: subprocess.Popen[Any]) -> None:
    """End the worker's whole process group (its JVM and Python workers) if anything is left."""
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def print_progress(system: str, event: dict[str, Any]) -> None:
    kind = event["event"]
    if kind == "trial":
        mark = "ok" if event["sustainable"] else event["reason"]
        confirm = " (confirmation)" if event["confirmation"] else ""
        print(
            f"  {system:18} {event['workload']:9} {event['rate']:>9,}/s{confirm}: "
            f"p50 {event['processing_p50_ms']:.0f} ms: {mark}",
            file=sys.stderr,
            flush=True,
        )
    elif kind == "latency":
        print(
            f"  {system:18} {event['workload']:9} latency at {event['rate']:,}/s: "
            f"p50 {event['p50_ms']:.0f} ms, p99 {event['p99_ms']:.0f} ms",
            file=sys.stderr,
            flush=True,
        )


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{workload: {system: {rate, confirmed, p50_ms, p99_ms, memory...}}}."""
    table: dict[str, dict[str, dict[str, Any]]] = {w: {} for w in WORKLOADS}
    for system, run in runs.items():
        for event in run["events"]:
            workload = event.get("workload")
            if workload is None:
                continue
            row = table[workload].setdefault(system, {"rate": 0})
            if event["event"] == "trial" and "load" in event:
                row.setdefault("loads", []).append(event["load"])
            elif event["event"] == "throughput":
                row.update(rate=event["rate"], confirmed=event["confirmed"])
            elif event["event"] == "latency":
                row.update(
                    latency_rate=event["rate"], p50_ms=event["p50_ms"], p99_ms=event["p99_ms"]
                )
        for workload in WORKLOADS:
            peaks = run["memory"].get(f"{workload}/latency") or run["memory"].get(
                f"{workload}/search"
            )
            if peaks and workload in table and system in table[workload]:
                table[workload][system]["memory_mb"] = peaks
    return table


def ratio(table: dict[str, dict[str, Any]], peer: str) -> float | None:
    ours, theirs = table.get("dstream", {}).get("rate"), table.get(peer, {}).get("rate")
    return ours / theirs if ours and theirs else None


def quick_lines(table: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """One line per workload: rates and the ratios dstream/pyspark.streaming, dstream/structured."""
    lines = []
    for workload, systems in table.items():
        if not systems:
            continue
        rates = ", ".join(f"{s} {systems[s].get('rate', 0):,}/s" for s in SYSTEMS if s in systems)
        ratios = []
        for peer in ("pyspark.streaming", "structured"):
            r = ratio(systems, peer)
            ratios.append(f"dstream/{peer} {r:.2f}x" if r else f"dstream/{peer} n/a")
        lines.append(f"{workload:9} {'; '.join(ratios)}  ({rates})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short searches, print ratios")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--no-recovery", action="store_true", help="skip recovery experiments")
    parser.add_argument("--quiet-wait", type=float, default=None, help="max s to wait for load")
    parser.add_argument(
        "--peers-with-dstream-daemon",
        action="store_true",
        help="run the peers on dstream's Python worker daemon too (how much of the gap it is)",
    )
    args = parser.parse_args(argv)
    plan = "quick" if args.quick else "full"
    systems = args.systems.split(",")
    workloads = args.workloads.split(",")
    wait = args.quiet_wait if args.quiet_wait is not None else (0 if args.quick else 900)
    load_before = wait_for_quiet(2.5, wait)
    started = time.time()
    priors = previous_rates()
    daemon = ["--dstream-daemon"] if args.peers_with_dstream_daemon else []
    runs = {
        system: run_worker(
            system,
            plan,
            workloads,
            ["--start-rates", json.dumps(priors.get(system, {})), *daemon],
        )
        for system in systems
    }
    table = summarize(runs)
    machine = describe_machine()
    machine["load_before"] = load_before
    machine["load_after"] = load_average()
    for line in quick_lines(table):
        print(line, flush=True)
    if args.quick:
        print(f"({time.time() - started:.0f} s, load {load_before[0]:.1f} before)", flush=True)
        return 0
    from bench.recovery import run_recovery
    from bench.report import write_report

    stamp = datetime.now().strftime("%Y-%m-%d")
    write_report(RESULTS, stamp, machine, table, runs, {})  # kept if recovery is cut short
    if not args.no_recovery:
        recovery = run_recovery(systems, table)
        machine["load_after"] = load_average()
        write_report(RESULTS, stamp, machine, table, runs, recovery)
    print(f"results: {RESULTS / stamp}.md", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
