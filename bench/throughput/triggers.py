"""`python -m bench.throughput triggers`: where a Structured Streaming trigger's time goes.

Runs one formulation of `systems.StructuredSystem` (`local[2]`, as a trial runs it) on the
`rate-micro-batch` source or, with `--source kafka`, on a topic fed at the rate on a broker it
starts, with Spark's event log on; then prints per trigger the query progress's `durationMs`
(what the trigger spent getting offsets, planning, running the batch, writing its logs), the
Spark jobs, stages and tasks it ran (by their `streaming.sql.batchId` property) with their
executor CPU time, and per stateful operator the state rows updated and removed, the time the
state store spent updating, removing and committing, and how many files it copied from the
checkpoint (a RocksDB instance reloading its state). Then the medians over the triggers after
the window filled. `--batch-interval MS` sets the trigger interval (1000 by default), `--conf
KEY=VALUE` a Spark SQL setting for A/B runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from pyspark import SparkContext

from bench.common import PARTITIONS, spark_conf
from bench.throughput import kafka_input
from bench.throughput.profile import event_log_conf, jobs_by_batch, read_events
from bench.throughput.reference import WINDOW_BATCHES
from bench.throughput.systems import StructuredSystem

BATCH_ID = "streaming.sql.batchId"  # the job property naming a job's micro-batch
PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "addBatch", "walCommit")
PHASES += ("commitOffsets",)
COLUMNS = PHASES + ("jobs", "stages", "tasks", "task_cpu")
OPERATOR_COLUMNS = ("updated", "removed", "update_ms", "remove_ms", "commit_ms", "files_copied")


def batch_id(properties: dict[str, str]) -> int | None:
    """The micro-batch a job ran for."""
    value = properties.get(BATCH_ID)
    return int(value) if value else None


def operator_row(operator: dict[str, Any]) -> dict[str, int]:
    """One stateful operator's work in one trigger, from its progress entry."""
    custom = operator.get("customMetrics", {})
    return {
        "updated": operator["numRowsUpdated"],
        "removed": operator["numRowsRemoved"],
        "update_ms": operator["allUpdatesTimeMs"],
        "remove_ms": operator["allRemovalsTimeMs"],
        "commit_ms": operator["commitTimeMs"],
        "files_copied": custom.get("rocksdbFilesCopied", 0),
    }


def trigger_row(progress: dict[str, Any], jobs: list[dict[str, Any]]) -> dict[str, int]:
    durations = progress["durationMs"]
    return {
        **{phase: durations.get(phase, 0) for phase in PHASES},
        "jobs": len(jobs),
        "stages": sum(j["stages"] for j in jobs),
        "tasks": sum(j.get("tasks", 0) for j in jobs),
        "task_cpu": sum(j.get("cpu_ms", 0) for j in jobs),
    }


def run(
    variant: str,
    source: str,
    rate: int,
    batches: int,
    log_dir: str,
    conf: dict[str, str],
    workload: str = "wordcount",
    batch_ms: int = 1000,
) -> list[dict[str, Any]]:
    """The query progress of `batches` triggers of the formulation."""
    spark = spark_conf("local[2]", PARTITIONS, "dstream.worker.pydaemon")
    spark.setAll(event_log_conf(log_dir))
    if source == "kafka":
        spark.set("spark.jars", ",".join(kafka_input.connector_jars()))
    sc = SparkContext(conf=spark)
    sc.setLogLevel("ERROR")
    broker = None
    try:
        feed = None
        if source == "kafka":
            broker = kafka_input.start_broker(Path(tempfile.mkdtemp(prefix="bench-kafka-")))
            feed = kafka_input.KafkaFeed(broker.bootstrap, PARTITIONS)
        system = StructuredSystem(sc, PARTITIONS, feed)
        for key, value in conf.items():
            system.spark.conf.set(key, value)
        system.run(workload, variant, rate, 0, batches, 10 * batches + 120, batch_ms)
        return sorted(system._progress, key=lambda p: p["batchId"])
    finally:
        sc.stop()
        if broker is not None:
            broker.stop()


def print_table(progress: list[dict[str, Any]], log_dir: str, batch_ms: int = 1000) -> None:
    grouped = jobs_by_batch(read_events(log_dir), batch_id)
    rows = [trigger_row(p, grouped.get(p["batchId"], [])) for p in progress]
    operators = [[operator_row(o) for o in p.get("stateOperators", [])] for p in progress]
    names = [f"{c[:9]:>9}" for c in COLUMNS]
    ops = [f"op{i}:" + ",".join(OPERATOR_COLUMNS) for i in range(len(operators[-1]))]
    print("batch  rows " + " ".join(names) + "  " + "  ".join(ops))
    for p, row, ops_of in zip(progress, rows, operators, strict=True):
        states = "  ".join(",".join(str(o[c]) for c in OPERATOR_COLUMNS) for o in ops_of)
        values = " ".join(f"{row[c]:>9}" for c in COLUMNS)
        print(f"{p['batchId']:>5} {p['numInputRows']:>5} {values}  {states}")
    window = WINDOW_BATCHES * 1000 // batch_ms
    skip = min(window, len(rows) // 2)  # after the window filled, if it did
    steady, steady_ops = rows[skip:], operators[skip:]
    medians = {c: statistics.median(r[c] for r in steady) for c in COLUMNS}
    print(f"median of the last {len(steady)}:")
    print("  " + "  ".join(f"{c} {medians[c]:g}" for c in COLUMNS))
    for i in range(len(steady_ops[-1])):
        of_op = [ops_of[i] for ops_of in steady_ops if len(ops_of) > i]
        values = "  ".join(
            f"{c} {statistics.median(o[c] for o in of_op):g}" for c in OPERATOR_COLUMNS
        )
        print(f"  op{i}: {values}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variant", choices=StructuredSystem.variants, default="expert")
    parser.add_argument("--source", choices=("rate", "kafka"), default="rate")
    parser.add_argument("--workload", default="wordcount")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=45)
    parser.add_argument("--batch-interval", type=int, default=1000, metavar="MS")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    log_dir = tempfile.mkdtemp(prefix="bench-eventlog-")
    progress = run(
        args.variant,
        args.source,
        args.rate,
        args.batches,
        log_dir,
        conf,
        args.workload,
        args.batch_interval,
    )
    if not progress:
        print("no trigger completed", file=sys.stderr)
        return 1
    print_table(progress, log_dir, args.batch_interval)
    return 0
