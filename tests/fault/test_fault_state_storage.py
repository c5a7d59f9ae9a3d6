"""Executor loss: state RDDs are kept in one copy by default, two with
`spark.dstream.state.replication=2` (the spec's sparkConf or --conf), so that a lost executor's
share of the cached state and window reductions is read from the other copy instead of
recomputed from the source. Output exactness across a kill is test_fault_executor_loss's."""

from __future__ import annotations

import operator

import pytest
from dstream import StreamingContext
from dstream.runtime.state_storage import REPLICATION_KEY, storage_level
from dstream.service.job import spark_conf
from fault.test_fault_speculation import job  # a minimal spec
from pyspark import StorageLevel


def test_state_has_one_copy_unless_asked_for_two():
    assert storage_level(None) == StorageLevel.MEMORY_ONLY
    assert storage_level("1") == StorageLevel.MEMORY_ONLY
    assert storage_level(" 2 ") == StorageLevel.MEMORY_ONLY_2


def test_the_spec_and_the_command_line_set_the_copies():
    spec_conf = spark_conf(job(sparkConf={REPLICATION_KEY: "2"}), "local-cluster[2,1,1024]", {})
    assert storage_level(spec_conf.get(REPLICATION_KEY)) == StorageLevel.MEMORY_ONLY_2
    cli_conf = spark_conf(job(sparkConf={REPLICATION_KEY: "2"}), None, {REPLICATION_KEY: "1"})
    assert storage_level(cli_conf.get(REPLICATION_KEY)) == StorageLevel.MEMORY_ONLY


def test_a_bad_setting_is_refused_naming_it():
    with pytest.raises(ValueError, match=REPLICATION_KEY):
        storage_level("3")


def state_streams(sc):
    """The streams whose RDDs are state: a reduced window and the per-batch reductions it
    subtracts, updateStateByKey's and track's state."""
    ssc = StreamingContext(sc, 1)
    pairs = ssc.queueStream([sc.parallelize([("a", 1)])])
    window = pairs.reduceByKeyAndWindow(operator.add, operator.sub, 10, 1)
    state = pairs.updateStateByKey(lambda values, total: sum(values) + (total or 0))
    tracked = pairs.track(lambda key, value: value, lambda key, total, value: total + value)
    return [window._parents[0], window, state, tracked._parents[0]]


def test_state_streams_take_the_level_from_the_context_settings(sc):
    assert all(s._storage_level == StorageLevel.MEMORY_ONLY for s in state_streams(sc))
    sc._conf.set(REPLICATION_KEY, "2")  # the live context's settings, as sparkConf would set
    try:
        assert all(s._storage_level == StorageLevel.MEMORY_ONLY_2 for s in state_streams(sc))
    finally:
        sc._conf._jconf.remove(REPLICATION_KEY)
