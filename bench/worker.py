"""One system in its own process: the throughput search and latency run for each workload.

The parent (`bench.run`) starts one worker per system so that each gets a fresh JVM and its
memory can be told apart; the worker prints one JSON object per line (phases, trials, results)
on stdout, which the parent reads while it samples the process tree's memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from dstream import pydaemon
from pyspark import SparkContext

from bench.search import find_max_rate
from bench.systems import SYSTEM_CLASSES, WORKLOADS, System, spark_conf
from bench.trial import judge, percentile, record_latencies


@dataclass(frozen=True)
class Plan:
    """How long trials are, and how hard the search tries."""

    warmup: int
    measured: int
    max_trials: int
    tolerance: float
    confirm: bool
    confirm_measured: int
    latency_measured: int


PLANS = {
    # Quick: two short trials per workload, starting from the last full run's rates; no latency.
    "quick": Plan(2, 4, 2, 0.25, False, 0, 0),
    "full": Plan(4, 10, 6, 0.1, True, 32, 30),
}
START_RATES = {"grep": 100_000, "wordcount": 30_000, "topk": 30_000}


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def timeout_for(batches: int) -> float:
    return 1.6 * batches + 25


def bench_workload(system: System, workload: str, plan: Plan, start: int) -> None:
    """Search the maximum sustainable rate, then measure latency at half of it."""

    def run(rate: int, confirmation: bool) -> Any:
        measured = plan.confirm_measured if confirmation else plan.measured
        began = time.monotonic()
        batches = system.run(
            workload, rate, plan.warmup, measured, timeout_for(plan.warmup + measured)
        )
        verdict = judge(batches, measured)
        emit(
            event="trial",
            workload=workload,
            rate=rate,
            confirmation=confirmation,
            seconds=round(time.monotonic() - began, 1),
            load=round(os.getloadavg()[0], 2),  # the machine is shared: what else ran
            batches=[b.to_json() for b in batches],
            **asdict(verdict),
        )
        return verdict

    emit(event="phase", workload=workload, phase="search")
    result = find_max_rate(run, start, plan.max_trials, plan.tolerance, plan.confirm)
    emit(
        event="throughput",
        workload=workload,
        rate=result.rate,
        confirmed=result.confirmed,
        trials=len(result.trials),
    )
    if not result.rate or not plan.latency_measured:
        return
    emit(event="phase", workload=workload, phase="latency")
    rate = max(100, result.rate // 2)
    batches = system.run(
        workload,
        rate,
        plan.warmup,
        plan.latency_measured,
        timeout_for(plan.warmup + plan.latency_measured),
    )
    latencies = record_latencies(batches)
    emit(
        event="latency",
        workload=workload,
        rate=rate,
        p50_ms=percentile(latencies, 0.5),
        p99_ms=percentile(latencies, 0.99),
        batches=[b.to_json() for b in batches],
    )
    emit(event="phase", workload=workload, phase="idle")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=sorted(SYSTEM_CLASSES), required=True)
    parser.add_argument("--plan", choices=sorted(PLANS), default="quick")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--start-rates", default="{}", help="JSON: workload -> first trial rate")
    parser.add_argument(
        "--dstream-daemon", action="store_true", help="run a peer on dstream's worker daemon too"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    starts = {**START_RATES, **json.loads(args.start_rates)}
    conf = spark_conf(args.master, args.partitions, args.system)
    if args.dstream_daemon:
        conf.setAll(list(pydaemon.SPARK_CONF.items()))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        system = SYSTEM_CLASSES[args.system](sc, args.partitions)
        emit(event="ready", system=args.system)
        for workload in args.workloads.split(","):
            bench_workload(system, workload, PLANS[args.plan], starts[workload])
    finally:
        sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
