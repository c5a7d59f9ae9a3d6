"""The DStream graph in the checkpoint: getOrCreate restores it without calling setup, as
pyspark.streaming does; start() rejects a function that cannot be pickled with pyspark.streaming's
exception type; a changed program restarts only when asked to (rebuild=True) and its streams
agree; a graph this program cannot load, or torn metadata, is refused by name."""

from __future__ import annotations

import base64
import json
import operator
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from dstream import StreamingContext
from dstream.runtime.checkpoint.directory import (
    METADATA_VERSION,
    CheckpointDir,
    CheckpointMismatchError,
    CheckpointUnrecoverableError,
)
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.scheduling.graph import GraphNotSerializableError
from py4j.protocol import Py4JJavaError

BATCH_TIMEOUT_S = 120


def add(new: list[int], total: int | None) -> int:
    return sum(new) + (total or 0)


class Program:
    """A stateful count over the rate source, written batch by batch to files (closures that
    capture only a path survive pickling, as a real program's sink must)."""

    def __init__(self, sc: Any, root: Path):
        self.sc = sc
        self.checkpoint = str(root / "checkpoint")
        self.out = root / "out"
        self.out.mkdir(parents=True)
        self.setup_calls = 0
        self.now_ms = 0

    def setup(self) -> StreamingContext:
        self.setup_calls += 1
        ssc = StreamingContext(self.sc, 1)
        initial = self.sc.parallelize([("initial", 100)])
        letters = ssc.rateStream(20, 1, seed=5).map(lambda line: (line[0], 1))
        totals = letters.updateStateByKey(add, initialRDD=initial)
        out = str(self.out)

        def save(time: Any, rdd: Any) -> None:
            name = f"{int(time.timestamp() * 1000)}.json"
            (Path(out) / name).write_text(json.dumps(sorted(rdd.collect())))

        totals.foreachRDD(save)
        return ssc

    def run(self, batches: int, **options: Any) -> StreamingContext:
        ssc = StreamingContext.getOrCreate(self.checkpoint, self.setup, **options)
        ssc._clock = ManualClock(self.now_ms)
        ssc.start()
        for _ in range(batches):
            self.now_ms += 1000
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(self.now_ms, BATCH_TIMEOUT_S)
        ssc.stop(stopSparkContext=False)
        return ssc

    def outputs(self) -> dict[int, list[Any]]:
        return {
            int(p.stem): [tuple(kv) for kv in json.loads(p.read_text())]
            for p in self.out.glob("*.json")
        }


def test_get_or_create_restores_the_graph_without_calling_setup(sc, tmp_path):
    program = Program(sc, tmp_path / "restarted")
    first = program.run(2)
    second = program.run(2)
    assert program.setup_calls == 1
    assert second._graph is not first._graph
    assert [type(s).__name__ for s in second._graph.streams] == [
        type(s).__name__ for s in first._graph.streams
    ]

    reference = Program(sc, tmp_path / "reference")
    reference.run(4)
    assert program.outputs() == reference.outputs()
    assert all(("initial", 100) in batch for batch in program.outputs().values())


def test_rebuild_runs_setup_and_the_streams_must_still_agree(sc, tmp_path):
    program = Program(sc, tmp_path)
    program.run(1)
    program.run(1, rebuild=True)
    assert program.setup_calls == 2
    assert sorted(program.outputs()) == [1000, 2000]

    def reshaped() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        ssc.rateStream(20, 1, seed=5).count().foreachRDD(lambda rdd: None)
        return ssc

    ssc = StreamingContext.getOrCreate(program.checkpoint, reshaped, rebuild=True)
    with pytest.raises(CheckpointMismatchError, match="different streaming graph"):
        ssc.start()


def test_a_graph_whose_code_is_gone_is_refused_with_the_way_out(sc, tmp_path, monkeypatch):
    module = tmp_path / "vanishing_job.py"
    module.write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_job

    checkpoint = str(tmp_path / "checkpoint")

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        ssc.rateStream(5, 1).map(vanishing_job.double).foreachRDD(lambda rdd: None)
        return ssc

    ssc = StreamingContext.getOrCreate(checkpoint, setup)
    ssc._clock = ManualClock(0)
    ssc.start()
    ssc.stop(stopSparkContext=False)
    module.unlink()
    del sys.modules["vanishing_job"]

    with pytest.raises(CheckpointMismatchError, match=r"cannot load .*rebuild=True"):
        StreamingContext.getOrCreate(checkpoint, setup)


def test_a_function_capturing_the_spark_context_fails_at_start_as_in_pyspark(sc, tmp_path):
    from pyspark.streaming import StreamingContext as PySparkStreamingContext

    raised = {}
    for engine in (PySparkStreamingContext, StreamingContext):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # pyspark.streaming's deprecation
            ssc = engine(sc, 1)
        ssc.checkpoint(str(tmp_path / engine.__module__))
        lines = ssc.queueStream([sc.parallelize(["a b"])])
        lines.foreachRDD(lambda rdd: sc.parallelize(rdd.collect()).count())
        with pytest.raises(Py4JJavaError) as caught:
            ssc.start()
        ssc.stop(stopSparkContext=False)
        raised[engine] = caught.value

    ours, theirs = raised[StreamingContext], raised[PySparkStreamingContext]
    assert isinstance(ours, GraphNotSerializableError)
    for error in (ours, theirs):
        assert "Could not serialize object" in str(error)
        assert "CONTEXT_ONLY_VALID_ON_DRIVER" in str(error)
    assert "foreachRDD at test_graph_checkpoint.py:" in str(ours)
    assert "CONTEXT_ONLY_VALID_ON_DRIVER" in ours.java_exception.getMessage()


def test_without_a_checkpoint_nothing_is_pickled_as_in_pyspark(sc):
    ssc = StreamingContext(sc, 1)
    ssc.queueStream([[1]]).foreachRDD(lambda rdd: sc.parallelize(rdd.collect()).count())
    ssc.start()  # pyspark.streaming starts this program too: the function runs on the driver
    ssc.stop(stopSparkContext=False)


def test_an_unpicklable_transform_names_its_operation(sc, tmp_path):
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(str(tmp_path))
    static = sc.parallelize([(1, "one")])
    numbers = ssc.queueStream([[(1, 1)]]).map(lambda kv: kv)
    numbers.transform(lambda rdd: rdd.join(static)).pprint()
    with pytest.raises(GraphNotSerializableError, match=r"transform at test_graph_checkpoint"):
        ssc.start()
    ssc.stop(stopSparkContext=False)


def test_version_one_metadata_recovers_by_running_setup(sc, tmp_path):
    CheckpointDir(tmp_path).write_metadata({"zeroMs": 0, "batchMs": 1000, "graph": []})
    calls = []

    def setup() -> StreamingContext:
        calls.append(1)
        return StreamingContext(sc, 1)

    StreamingContext.getOrCreate(str(tmp_path), setup)
    assert calls == [1]


def test_metadata_from_a_newer_version_is_refused(tmp_path):
    CheckpointDir(tmp_path).write_metadata({"version": METADATA_VERSION + 1, "zeroMs": 0})
    with pytest.raises(CheckpointMismatchError, match="metadata version"):
        CheckpointDir(tmp_path).read_metadata()


def test_torn_metadata_and_backup_are_refused_by_name(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    checkpoint.write_metadata({"version": METADATA_VERSION, "zeroMs": 0})
    for name in ("metadata.json", "metadata.json.bk"):
        path = tmp_path / name
        path.write_bytes(path.read_bytes()[:-9])
    with pytest.raises(CheckpointUnrecoverableError, match="torn and so is its backup"):
        checkpoint.read_metadata()


def test_the_metadata_holds_the_graph_and_the_spark_settings(sc, tmp_path):
    program = Program(sc, tmp_path)
    program.run(1)
    metadata = CheckpointDir(program.checkpoint).read_metadata()
    assert metadata["version"] == METADATA_VERSION
    assert base64.b64decode(metadata["pickledGraph"])
    assert ["spark.master", "local[2]"] in metadata["sparkConf"]


def metadata_bytes(checkpoint: str) -> int:
    return len(CheckpointDir(checkpoint).read_metadata()["pickledGraph"])


def test_a_checkpoint_keeps_no_queued_rdd_and_refuses_to_restore_a_queue(sc, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        queued = [sc.range(i * 200_000, (i + 1) * 200_000) for i in range(3)]
        ssc.queueStream(queued).count().foreachRDD(lambda rdd: None)
        return ssc

    ssc = StreamingContext.getOrCreate(checkpoint, setup)
    ssc._clock = ManualClock(0)
    ssc.start()
    ssc.stop(stopSparkContext=False)
    assert metadata_bytes(checkpoint) < 20_000  # 600,000 numbers by value would be megabytes
    with pytest.raises(CheckpointMismatchError, match=r"queueStream.*rebuild=True"):
        StreamingContext.getOrCreate(checkpoint, setup)


def test_an_initial_rdd_is_written_by_the_executors_and_a_torn_one_is_named(sc, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")

    def setup() -> StreamingContext:
        ssc = StreamingContext(sc, 1)
        initial = sc.range(300_000).map(lambda i: (i % 3, 1))
        ssc.rateStream(5, 1).map(lambda line: (0, 0)).updateStateByKey(
            add, initialRDD=initial
        ).foreachRDD(lambda rdd: None)
        return ssc

    ssc = StreamingContext.getOrCreate(checkpoint, setup)
    ssc._clock = ManualClock(0)
    ssc.start()
    ssc.stop(stopSparkContext=False)
    assert metadata_bytes(checkpoint) < 20_000
    [stored] = (Path(checkpoint) / "rdds").iterdir()
    assert (stored / "_SUCCESS").exists()
    restored = StreamingContext.getOrCreate(checkpoint, setup)
    [state] = [s for s in restored._graph.streams if type(s).__name__ == "StateDStream"]
    assert sorted(state._initial.reduceByKey(operator.add).collect()) == [
        (k, 100_000) for k in range(3)
    ]

    (stored / "_SUCCESS").unlink()
    with pytest.raises(CheckpointUnrecoverableError, match=rf"{stored}.*not completely written"):
        StreamingContext.getOrCreate(checkpoint, setup)
