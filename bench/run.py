"""`python -m bench`: the results file of a day, bench/results/<date>.md and .json: every
system and variant searched for its maximum rate (bench.throughput), then the recovery
experiments at half of those maxima (bench.recovery).

Two tables, one per Python worker daemon (dstream.worker.pydaemon, then pyspark.daemon): for
each, one worker process per system (its own JVM) stays up, and the searches of all (system,
variant) pairs for a workload advance together, one trial each in turn (the order reversed
every round), so that a change in the machine's load reaches all of them alike. Every search
starts from the same fixed rates, never from earlier results. Each trial runs under the load
gate (`bench.machine`): a trial during which other processes used the CPU is redone, at most
`--retries` times, then reported as "machine busy".

`--quick` (make bench-quick) runs short search trials without confirmations and prints what
they found, labelled as not a result; it writes nothing. The full run (make bench) confirms
every maximum, runs the recovery experiments and writes bench/results/<date>.md and .json.
`--allow-load` lets trials count although others loaded the machine: a smoke run of the
harness, labelled so, never written to bench/results. `--merge` adds this run's rows to the
day's results instead of replacing them (a table that takes hours can be measured in another
run); `--recovery-only` runs only the recovery experiments, at half of the maxima the day's
results already hold. After each workload's searches, every peer's latency is measured at
dstream's confirmed rates (bench/throughput/same_rate.py); `--same-rate-only` runs only that,
at the rates the day's results already hold.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from dstream.runtime.control.latency import LATENCY_BUCKETS_S

from bench.common import DAEMONS, RESULTS
from bench.machine import describe_machine, git_commit
from bench.recovery.faults import run_recovery
from bench.report import load_report, write_report
from bench.throughput.kafka_input import WORKLOADS as KAFKA_WORKLOADS
from bench.throughput.kafka_input import start_broker
from bench.throughput.searches import PLANS, Gate, progress, run_table, summary_lines
from bench.throughput.systems import SYSTEMS, WORKLOADS
from bench.throughput.trial import LATENCY_TARGET_INTERVALS, latency_target_ms


def tag_rows(tables: dict[str, dict[str, Any]], run: int) -> None:
    """Rows measured by run number `run` say so; rows of earlier runs keep their number."""
    for table in tables.values():
        for rows in table.values():
            for row in rows.values():
                row.setdefault("run", run)
                for entry in row.get("at_this_rate", {}).values():
                    entry.setdefault("run", run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short searches, no confirmation")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--workloads", default=None, help="comma list (default: all)")
    parser.add_argument("--variants", default=None, help="comma list (default: all)")
    parser.add_argument("--daemons", default=",".join(DAEMONS))
    parser.add_argument("--no-recovery", action="store_true", help="skip recovery experiments")
    parser.add_argument(
        "--batch-interval",
        type=int,
        default=1000,
        metavar="MS",
        help="batch interval (Structured Streaming: trigger interval) of the trials, in ms "
        "(e.g. 500); other than 1000 excludes the recovery experiments",
    )
    parser.add_argument(
        "--source",
        choices=("rate", "kafka"),
        default="rate",
        help="kafka: every trial reads a topic fed at its rate on a broker started for the run "
        "(bench/README.md, 'Kafka'); trials only, add --no-recovery",
    )
    parser.add_argument(
        "--master",
        default="local[2]",
        help="the Spark master of every system's JVM, e.g. local-cluster[2,1,1024] (rows are "
        "named after it); other than local[2] excludes the recovery experiments",
    )
    parser.add_argument("--busy-cores", type=float, default=0.25, help="others' CPU limit")
    parser.add_argument("--busy-block", type=float, default=10.0, help="seconds per stretch")
    parser.add_argument("--retries", type=int, default=2, help="redos of a busy trial")
    parser.add_argument(
        "--allow-load",
        action="store_true",
        help="smoke run: count trials despite others' load (labelled, never written)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="add to today's results: rows this run does not measure stay as written",
    )
    parser.add_argument(
        "--recovery-only",
        action="store_true",
        help="only recovery, at half of today's dstream.worker.pydaemon maxima (implies --merge)",
    )
    parser.add_argument(
        "--same-rate-only",
        action="store_true",
        help="no searches: every peer's latency at the dstream rates today's results hold "
        "(bench/throughput/same_rate.py; implies --merge, trials only)",
    )
    args = parser.parse_args(argv)
    plan = PLANS["quick" if args.quick else "full"].at_interval(args.batch_interval)
    gate = Gate(args.busy_cores, args.busy_block, args.retries, args.allow_load)
    offered = KAFKA_WORKLOADS if args.source == "kafka" else WORKLOADS
    systems, workloads = args.systems.split(","), (args.workloads or ",".join(offered)).split(",")
    if set(workloads) - set(offered):
        parser.error(f"--workloads: {args.source} trials run {', '.join(offered)}")
    recovers = not (args.quick or args.allow_load or args.no_recovery or args.same_rate_only)
    if plan.batch_ms != 1000 and recovers:
        parser.error(f"--batch-interval {plan.batch_ms}: trials only; add --no-recovery")
    target_s = latency_target_ms(plan.batch_ms) / 1000
    if target_s not in LATENCY_BUCKETS_S:
        parser.error(
            f"--batch-interval {plan.batch_ms}: its latency target ({LATENCY_TARGET_INTERVALS} "
            f"intervals, {target_s:g} s) must be a bucket bound of the latency histogram "
            f"({', '.join(f'{b:g}' for b in LATENCY_BUCKETS_S)} s), which counts the records "
            "within it"
        )
    if args.master != "local[2]" and recovers:
        parser.error(f"--master {args.master}: trials only; add --no-recovery")
    if args.source == "kafka" and recovers:
        parser.error("--source kafka: trials only; add --no-recovery")
    variants = set(args.variants.split(",")) if args.variants else None
    machine = describe_machine()
    started = time.time()
    daemons = [] if args.recovery_only else args.daemons.split(",")
    writes = not (args.quick or args.allow_load)
    stamp = datetime.now().strftime("%Y-%m-%d")
    merges = args.merge or args.recovery_only or args.same_rate_only
    earlier = load_report(RESULTS, stamp) if merges else None
    tables: dict[str, dict[str, Any]] = earlier["tables"] if earlier else {}
    recovery: dict[str, Any] = earlier["recovery"] if earlier else {}
    runs: list[dict[str, Any]] = earlier["runs"] if earlier else []
    runs.append(
        {
            "started": datetime.now().isoformat(timespec="minutes"),
            "commit": git_commit(),
            "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "batch_interval_ms": plan.batch_ms,
            "load_at_start": os.getloadavg(),
        }
    )
    pending = [f"{workload} on {daemon}" for daemon in daemons for workload in workloads]
    pending += ["recovery"] if recovers else []

    def write() -> None:
        """The results so far: a run of hours may be stopped, and what it measured stays."""
        if writes:
            runs[-1]["load_at_end"] = os.getloadavg()
            tag_rows(tables, len(runs))
            path = write_report(
                RESULTS, stamp, machine, runs, tables, recovery, gate, plan, pending
            )
            progress(f"results{' so far' if pending else ''}: {path}")

    broker = (
        start_broker(Path(tempfile.mkdtemp(prefix="bench-kafka-")))
        if args.source == "kafka"
        else None
    )
    try:
        for daemon in daemons:

            def measured(workload: str, daemon: str = daemon) -> None:
                pending.remove(f"{workload} on {daemon}")
                write()

            run_table(
                daemon,
                systems,
                workloads,
                variants,
                plan,
                gate,
                tables.setdefault(daemon, {}),
                measured,
                broker.bootstrap if broker else None,
                args.master,
                search=not args.same_rate_only,
            )
    finally:
        if broker is not None:
            broker.stop()
    label = "QUICK RUN: search trials only, no confirmation; NOT A RESULT" if args.quick else ""
    if args.allow_load:
        label = "SMOKE RUN with --allow-load (other processes loaded the machine); NOT A RESULT"
    for daemon in daemons:
        print(
            "\n".join(summary_lines(tables[daemon], f"{label or 'RESULT'}: worker daemon {daemon}"))
        )
    print(f"({time.time() - started:.0f} s)", flush=True)
    if writes and recovers:
        recovery.clear()
        recovery.update(run_recovery(systems, tables.get(DAEMONS[0], {}), DAEMONS[0]))
        recovery["run"] = len(runs)
        pending.remove("recovery")
        write()
    return 0
