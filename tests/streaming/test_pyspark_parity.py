"""The same operations on pyspark.streaming itself, in the same SparkContext: same results.

This is the evidence behind "ports by changing the import": each case's expected output is
checked against Spark's own (deprecated) DStream implementation, batch for batch.
"""

from __future__ import annotations

import warnings

import pytest
from cases import CASES, Case
from conditions import eventually

WAIT_S = 120


def run_on_pyspark_streaming(sc, case: Case, checkpoint_dir: str) -> list[list]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from pyspark.streaming import StreamingContext

        ssc = StreamingContext(sc, case.batch_seconds)
    if case.stateful:
        ssc.checkpoint(checkpoint_dir)
    streams = [ssc.queueStream([sc.parallelize(b) for b in case.inputs])]
    if case.inputs2 is not None:
        streams.append(ssc.queueStream([sc.parallelize(b) for b in case.inputs2]))
    results: list[list] = []

    def gather(rdd):
        records = rdd.collect()
        results.append(sorted(records) if case.sort else records)

    case.op(*streams).foreachRDD(gather)
    ssc.start()
    try:
        eventually(
            lambda: len(results) >= len(case.expected),
            WAIT_S,
            message=lambda: f"{len(case.expected)} batches (pyspark.streaming gave {len(results)})",
        )
    finally:
        ssc.stop(stopSparkContext=False, stopGraceFully=False)
    return results[: len(case.expected)]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_same_results_as_pyspark_streaming(sc, case: Case, tmp_path):
    assert run_on_pyspark_streaming(sc, case, str(tmp_path)) == case.expected
