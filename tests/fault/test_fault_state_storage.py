"""Executor loss: state RDDs are kept in two copies on a cluster master by default, so a lost
executor's half of the cached state and window reductions is read from the other copy instead of
recomputed from the source; `spark.dstream.state.replication` (the spec's sparkConf or --conf)
overrides it. Output exactness across a kill with these defaults is test_fault_executor_loss's
(it runs `local-cluster`, hence two copies)."""

from __future__ import annotations

import operator

import pytest
from pyspark import StorageLevel

from dstream import StreamingContext
from dstream.runtime.state_storage import REPLICATION_KEY, storage_level
from dstream.service.job import spark_conf
from dstream.spec import parse_job


def job(**spec_extra):
    return parse_job(
        {
            "apiVersion": "dstream.dev/v1alpha1",
            "kind": "StreamingJob",
            "metadata": {"name": "replicated"},
            "spec": {
                "batchInterval": "1s",
                "app": {"builtin": "wordcount"},
                "source": {"type": "rate", "rate": {"recordsPerSecond": 10}},
                **spec_extra,
            },
        }
    )


@pytest.mark.parametrize(
    "master",
    ["local-cluster[2,1,1024]", "spark://10.0.0.1:7077", "k8s://https://10.0.0.1:6443"],
)
def test_state_has_two_copies_on_a_cluster_master(master):
    assert storage_level(master, None) == StorageLevel.MEMORY_ONLY_2


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]"])
def test_state_has_one_copy_where_the_driver_is_the_only_executor(master):
    assert storage_level(master, None) == StorageLevel.MEMORY_ONLY


def test_the_spec_and_the_command_line_override_the_copies():
    spec_conf = spark_conf(job(sparkConf={REPLICATION_KEY: "1"}), "local-cluster[2,1,1024]", {})
    assert storage_level(spec_conf.get("spark.master"), spec_conf.get(REPLICATION_KEY)) == (
        StorageLevel.MEMORY_ONLY
    )
    cli_conf = spark_conf(job(), "local[2]", {REPLICATION_KEY: "2"})
    assert storage_level(cli_conf.get("spark.master"), cli_conf.get(REPLICATION_KEY)) == (
        StorageLevel.MEMORY_ONLY_2
    )


def test_a_bad_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match=REPLICATION_KEY):
        storage_level("local-cluster[2,1,1024]", "3")


def test_stateful_streams_and_window_reductions_use_the_state_level(sc):
    ssc = StreamingContext(sc, 1)
    pairs = ssc.queueStream([sc.parallelize([("a", 1)])])
    window = pairs.reduceByKeyAndWindow(operator.add, operator.sub, 10, 1)
    reduced = window._parents[0]  # the per-batch reductions the window subtracts
    state = pairs.updateStateByKey(lambda values, total: sum(values) + (total or 0))
    tracked = pairs.track(lambda key, value: value, lambda key, total, value: total + value)
    tracked = tracked._parents[0]  # the TrackedDStream under its mapValues
    for stream in (reduced, window, state, tracked):
        assert stream._storage_level == StorageLevel.MEMORY_ONLY  # local[2]: one copy
