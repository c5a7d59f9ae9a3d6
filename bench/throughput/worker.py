"""One system in its own process (its own JVM), running the trials its parent asks for.

The parent (`searches`, run by `python -m bench`) keeps one worker per system alive and
interleaves their trials: it
writes one JSON command per line on the worker's stdin ({"workload", "variant", "rate",
"warmup", "measured", "samples"}, optionally "batch_ms" and "timeout_s": a test's room on a
loaded machine) and reads one JSON result per line from its stdout. The worker
checks the trial's sampled outputs against `reference` before judging its speed.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict
from typing import Any

from pyspark import SparkContext

from bench.common import DAEMONS, PARTITIONS, emit
from bench.throughput import programs
from bench.throughput.kafka_input import KafkaFeed, connector_jars
from bench.throughput.reference import check_outputs
from bench.throughput.systems import SYSTEM_CLASSES, System, system_conf
from bench.throughput.trial import judge


def timeout_for(batches: int) -> float:
    """Room for a slow start (Structured Streaming plans its first micro-batch for seconds)."""
    return 1.6 * batches + 60


def restricted_output(system: str, variant: str, workload: str) -> bool:
    """Structured Streaming's plain formulation outputs, in update mode, the window's counts of
    the words its micro-batch updated only."""
    return system == "structured" and variant == "plain" and workload not in programs.GREPS


def run_trial(system: System, command: dict[str, Any]) -> dict[str, Any]:
    workload, variant, rate = command["workload"], command["variant"], command["rate"]
    warmup, measured = command["warmup"], command["measured"]
    batch_ms = command.get("batch_ms", 1000)
    began = time.monotonic()
    timeout_s = command.get("timeout_s") or timeout_for(warmup + measured)
    run = system.run(workload, variant, rate, warmup, measured, timeout_s, batch_ms)
    seconds = time.monotonic() - began
    check = check_outputs(
        workload,
        rate,
        system.partitions,
        run.outputs,
        run.intervals,
        command["samples"],
        restricted_output(system.name, variant, workload),
        batch_ms,
        run.inputs,
    )
    verdict = judge(
        [b.processing_ms for b in run.batches],
        [b.scheduling_ms for b in run.batches],
        measured,
        check.ok,
        check.reason,
        batch_ms,
        [b.latency_p99_ms for b in run.batches],
        [b.latency_buckets for b in run.batches],
    )
    return {
        "event": "trial",
        **command,
        "seconds": round(seconds, 1),
        "checked_batches": check.checked,
        "settled_after": run.settled_after,
        "verdict": asdict(verdict),
        "batches": [b.to_json() for b in run.batches],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--system", choices=sorted(SYSTEM_CLASSES), required=True)
    parser.add_argument("--daemon", choices=DAEMONS, required=True)
    parser.add_argument("--partitions", type=int, default=PARTITIONS)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--kafka", metavar="BOOTSTRAP", help="read a topic fed on this broker")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    conf = system_conf(args.system, args.master, args.partitions, args.daemon)
    if args.kafka and args.system == "structured":
        conf.set("spark.jars", ",".join(connector_jars()))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    kafka = KafkaFeed(args.kafka, args.partitions) if args.kafka else None
    try:
        system = SYSTEM_CLASSES[args.system](sc, args.partitions, kafka)
        emit(event="ready", system=args.system, daemon=args.daemon)
        for line in sys.stdin:
            command = json.loads(line)
            if command.get("quit"):
                break
            emit(**run_trial(system, command))
    finally:
        sc.stop()
    return 0
