"""docs/porting.md against pyspark itself: every public method of pyspark.streaming's
StreamingContext, DStream and StreamingListener has a row, rows agree with what dstream has,
named tests exist; and the differences the table claims that no other test shows."""

from __future__ import annotations

import inspect
import re
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import dstream
import pytest
from dstream.runtime.control.failure import FailurePolicy
from running_driver import program_output
from streams import final_failure, manual_context, run_batches

ROOT = Path(__file__).parents[2]
CLASSES = ("StreamingContext", "DStream", "StreamingListener")
STATUSES = ("same", "different", "absent")


def public_methods(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")} - {"Java"}


def table() -> dict[tuple[str, str], tuple[str, str, str]]:
    """The rows of the methods table: (class, method) -> (status, how and why, test)."""
    rows = {}
    for line in (ROOT / "docs" / "porting.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] not in CLASSES:
            continue
        cls, method, status, why, test = cells
        assert status in STATUSES, line
        assert (cls, method) not in rows, f"{cls}.{method} twice"
        rows[(cls, method.strip("`"))] = (status, why, test.strip("`"))
    return rows


def test_every_public_method_of_pyspark_streaming_has_a_row():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import pyspark.streaming as pyspark_streaming
    theirs = {
        (name, method)
        for name in CLASSES
        for method in public_methods(getattr(pyspark_streaming, name))
    }
    assert set(table()) == theirs


@pytest.mark.parametrize("row", sorted(table().items()), ids=lambda r: f"{r[0][0]}.{r[0][1]}")
def test_a_row_agrees_with_dstream_and_names_a_test_that_exists(row):
    (cls, method), (status, why, test) = row
    present = method in public_methods(getattr(dstream, cls))
    assert present == (status != "absent"), f"{cls}.{method} is {status} but present={present}"
    if status != "same":
        assert why, f"{cls}.{method}: a {status} method must say why"
    if status == "different":
        assert test, f"{cls}.{method}: a difference must name the test that shows it"
    if test:
        path, _, name = test.partition("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(), re.MULTILINE), test


def scala_rows() -> list[tuple[list[str], str, str]]:
    """The rows of the table of Scala Spark's mapWithState: (dstream names, status, test)."""
    text = (ROOT / "docs" / "porting.md").read_text()
    section = text.split("## From Scala Spark: mapWithState", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            continue
        _scala, ours, status, _why, test = cells
        assert status in STATUSES, line
        rows.append((re.findall(r"`([\w.]+)`", ours), status, test.strip("`")))
    return rows


def test_every_row_from_scala_spark_names_what_dstream_has_and_a_test_that_exists():
    import dstream.state

    rows = scala_rows()
    assert len(rows) >= 9
    for names, status, test in rows:
        assert bool(names) == (status != "absent"), (names, status)
        for name in names:
            owner, _, attribute = name.partition(".")
            assert hasattr(getattr(dstream.state, owner), attribute), name
        if test:
            path, _, function = test.partition("::")
            assert re.search(rf"^def {function}\(", (ROOT / path).read_text(), re.MULTILINE), test


class Recorder(dstream.StreamingListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def _record(self, name: str, event: Any) -> None:
        self.calls.append((name, event.batchInfo() if hasattr(event, "batchInfo") else event))

    def onStreamingStarted(self, streamingStarted: Any) -> None:
        self._record("onStreamingStarted", streamingStarted)

    def onBatchSubmitted(self, batchSubmitted: Any) -> None:
        self._record("onBatchSubmitted", batchSubmitted)

    def onBatchStarted(self, batchStarted: Any) -> None:
        self._record("onBatchStarted", batchStarted)

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        self._record("onBatchCompleted", batchCompleted)

    def onOutputOperationStarted(self, outputOperationStarted: Any) -> None:
        self._record("onOutputOperationStarted", outputOperationStarted)

    def onOutputOperationCompleted(self, outputOperationCompleted: Any) -> None:
        self._record("onOutputOperationCompleted", outputOperationCompleted)


def test_listeners_get_python_batch_info_and_batch_events_only(sc):
    ssc = manual_context(sc)
    recorder = Recorder()
    ssc.addStreamingListener(recorder)
    ssc.queueStream([[1, 2, 3]]).foreachRDD(lambda rdd: rdd.count())
    run_batches(ssc, 1)

    assert [name for name, _ in recorder.calls] == [
        "onBatchSubmitted",
        "onBatchStarted",
        "onBatchCompleted",
    ]
    info = recorder.calls[-1][1]
    assert info.batchTime() == datetime.fromtimestamp(1)
    assert isinstance(info.schedulingDelay(), int)
    assert isinstance(info.processingDelay(), int)
    assert info.totalDelay() == info.schedulingDelay() + info.processingDelay()
    assert not hasattr(info, "outputOperationInfos")


def test_a_failed_batch_raises_its_own_exception(sc):
    """Each failed attempt reaches awaitTermination at once with the batch's own exception;
    when the retries (failurePolicy) are spent, a BatchFailedError whose cause it is. With
    onExhausted: skip, as in pyspark.streaming, later batches run on after the raise."""

    def store_down(rdd: Any) -> None:
        raise OSError("the store is down")

    for policy in (FailurePolicy(retries=1, backoff_s=2.0), FailurePolicy(0, 1.0, "skip")):
        ssc = manual_context(sc)
        ssc.queueStream([[1]]).foreachRDD(store_down)
        ssc.start()
        ssc._scheduler.failure_policy = policy
        ssc._clock.advance(1000)
        with pytest.raises(OSError, match="the store is down"):
            ssc.awaitTermination(120)
        if not policy.skips:
            own = final_failure(ssc, 120).__cause__
            assert isinstance(own, OSError) and str(own) == "the store is down"
        ssc.stop(stopSparkContext=False)


@pytest.mark.slow
def test_failed_batches_surface_as_in_pyspark_streaming():
    """tests/programs/failing_batches.py: Spark's own test_dstream.py cases of failing
    functions, in a process of their own (the last needs a SparkConf of its own), its JVMs on
    the quick JIT only, as the tests' drivers."""
    seen = program_output(ROOT / "tests" / "programs" / "failing_batches.py", timeout_s=600)
    for scenario in ("map", "transformWith", "skippedRaised"):
        assert "This is a special error" in seen[scenario], scenario
    assert seen["skipped"] == [[0], [2], [3]]
