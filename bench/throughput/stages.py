"""`python -m bench.throughput stages`: how many Spark stages and tasks each batch of a stateful
stream runs.

State kept partitioned in place costs one shuffle per batch (the new records to their keys'
partitions) and no more: a batch runs a shuffle-map stage over its input and one result stage
that merges it into the state. A stream that reshuffled its state would run a third stage. This
runs the engine's stateful operators at a small rate and prints the stages per batch; batches
that also write a state checkpoint run one more job.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
from typing import Any

from pyspark import SparkContext

from bench.common import PARTITIONS, RECORD_BYTES, SEED, spark_conf


def _graphs() -> dict[str, Any]:
    from dstream.service import apps
    from dstream.spec import WordcountArgs

    def window(ssc: Any, lines: Any) -> Any:
        return apps.wordcount(ssc, lines, WordcountArgs(window="10s", slide="1s"))

    def update_state(ssc: Any, lines: Any) -> Any:
        words = lines.flatMap(str.split).map(lambda word: (word, 1))
        return words.updateStateByKey(lambda new, old: sum(new) + (old or 0))

    def track(ssc: Any, lines: Any) -> Any:
        words = lines.flatMap(str.split).map(lambda word: (word, 1))
        return words.track(lambda _k, e: e, lambda _k, s, e: s + e, timeout=5)

    return {"window": window, "updateStateByKey": update_state, "track": track}


class StageCounter:
    """Listener: completed stages and tasks of each batch's jobs (by the batch's job group)."""

    def __init__(self, sc: SparkContext):
        self._sc = sc
        self.per_batch: list[tuple[int, int, int]] = []
        self.done = threading.Event()
        self.wanted = 0

    def onBatchCompleted(self, event: Any) -> None:
        tracker = self._sc.statusTracker()
        group = f"dstream-batch-{event.batchInfo().batch_time_ms}"
        jobs = tracker.getJobIdsForGroup(group)
        stages = tasks = 0
        for job in jobs:
            info = tracker.getJobInfo(job)
            for stage_id in info.stageIds if info else []:
                stage = tracker.getStageInfo(stage_id)
                if stage and stage.numCompletedTasks:
                    stages += 1
                    tasks += stage.numCompletedTasks
        self.per_batch.append((len(jobs), stages, tasks))
        if len(self.per_batch) >= self.wanted:
            self.done.set()


def count_stages(sc: SparkContext, name: str, build: Any, batches: int) -> list[tuple[int, ...]]:
    from dstream.context import StreamingContext

    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(tempfile.mkdtemp(prefix="bench-stages-"))
    lines = ssc.rateStream(2000, PARTITIONS, SEED, RECORD_BYTES)
    build(ssc, lines).foreachRDD(lambda rdd: rdd.count())
    counter = StageCounter(sc)
    counter.wanted = batches
    ssc.addStreamingListener(counter)
    ssc.start()
    counter.done.wait(10 * batches + 60)
    ssc.stop(stopSparkContext=False)
    return counter.per_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=15)
    args = parser.parse_args(argv)
    sc = SparkContext(conf=spark_conf("local[2]", PARTITIONS, "dstream.worker.pydaemon"))
    sc.setLogLevel("ERROR")
    try:
        for name, build in _graphs().items():
            per_batch = count_stages(sc, name, build, args.batches)
            steady = [stages for jobs, stages, _tasks in per_batch[2:] if jobs == 1]
            print(
                f"{name:17} stages per batch (jobs, stages, tasks): {per_batch}; "
                f"steady state without a checkpoint job: max {max(steady, default=0)} stages"
            )
    finally:
        sc.stop()
    return 0
