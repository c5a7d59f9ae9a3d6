"""Executor loss: state RDDs are kept in one copy by default, two with
`spark.dstream.state.replication=2` (the spec's sparkConf or --conf), so that a lost executor's
share of the cached state and window reductions is read from the other copy instead of
recomputed from the source, also at a second loss soon after the first. Output exactness
across a kill is test_fault_executor_loss's."""

from __future__ import annotations

import operator
import warnings
from pathlib import Path

import pytest
from dstream import StreamingContext
from dstream.runtime.state.memory import PEERS_TTL_KEY, REPLICATION_KEY, SPARK_CONF, storage_level
from dstream.service.job import spark_conf
from fault.test_fault_speculation import job  # a minimal spec
from pyspark import StorageLevel
from running_driver import program_output

SECOND_LOSS = Path(__file__).parent.parent / "programs" / "second_loss.py"


def test_state_has_one_copy_unless_asked_for_two():
    assert storage_level(None) == StorageLevel.MEMORY_ONLY
    assert storage_level("1") == StorageLevel.MEMORY_ONLY
    assert storage_level(" 2 ") == StorageLevel.MEMORY_ONLY_2


def test_the_spec_and_the_command_line_set_the_copies():
    spec_conf = spark_conf(job(sparkConf={REPLICATION_KEY: "2"}), "local-cluster[2,1,1024]", {})
    assert storage_level(spec_conf.get(REPLICATION_KEY)) == StorageLevel.MEMORY_ONLY_2
    cli_conf = spark_conf(job(sparkConf={REPLICATION_KEY: "2"}), None, {REPLICATION_KEY: "1"})
    assert storage_level(cli_conf.get(REPLICATION_KEY)) == StorageLevel.MEMORY_ONLY


def test_executors_ask_the_driver_for_their_peers_every_second_unless_the_spec_says_otherwise():
    assert spark_conf(job(), None, {}).get(PEERS_TTL_KEY) == SPARK_CONF[PEERS_TTL_KEY] == "1000"
    own = spark_conf(job(sparkConf={PEERS_TTL_KEY: "5000"}), None, {})
    assert own.get(PEERS_TTL_KEY) == "5000"


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
        with pytest.warns(UserWarning, match=PEERS_TTL_KEY):
            assert all(s._storage_level == StorageLevel.MEMORY_ONLY_2 for s in state_streams(sc))
        sc._conf.set(PEERS_TTL_KEY, SPARK_CONF[PEERS_TTL_KEY])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            state_streams(sc)
    finally:
        sc._conf._jconf.remove(REPLICATION_KEY)
        sc._conf._jconf.remove(PEERS_TTL_KEY)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("settings", ["engine", "spark"])
def test_a_survivors_blocks_keep_their_second_copy_through_the_next_loss(settings):
    """tests/programs/second_loss.py on `local-cluster[2,1,1024]`: after one executor's loss the
    survivor stores blocks alone, the replacement registers, the survivor stores more, then it
    is lost too. With the engine's peer cache of a second its later blocks had their second
    copy on the replacement and none is computed again; with Spark's 60 s cache it still knew
    no peer, and every one is (what made the first batch after a kill recompute the state from
    its last checkpoint, bench/results/2026-12-02-recovery.md, "The second copy after a loss")."""
    seen = program_output(SECOND_LOSS, settings)
    assert seen["stored_alone"], "the replacement registered before the survivor stored alone"
    assert seen["on_survivor"], "the survivor stored none of the blocks between the losses"
    assert seen["recomputed"] == ([] if settings == "engine" else seen["on_survivor"])
