"""dstream's combineByKey: the same RDD as PySpark's (values and partitioning), and the hand-over
to PySpark's spilling merger when a worker runs short of memory."""

from __future__ import annotations

import operator
from collections import Counter

import pytest
from dstream.worker import combine
from pyspark.serializers import CPickleSerializer
from pyspark.shuffle import Aggregator


def to_list(value: int) -> list[int]:
    return [value]


def append(values: list[int], value: int) -> list[int]:
    values.append(value)
    return values


def extend(values: list[int], more: list[int]) -> list[int]:
    values.extend(more)
    return values


def test_combine_by_key_gives_pysparks_result_in_pysparks_partitions(sc):
    records = [(f"k{i % 37}", i) for i in range(2_000)]
    rdd = sc.parallelize(records, 3)
    ours = combine.combineByKey(rdd, to_list, append, extend, 4)
    theirs = rdd.combineByKey(to_list, append, extend, 4)
    assert ours.partitioner == theirs.partitioner
    placed = [sorted((k, sorted(v)) for k, v in part) for part in ours.glom().collect()]
    assert placed == [sorted((k, sorted(v)) for k, v in part) for part in theirs.glom().collect()]
    summed = dict(combine.reduceByKey(rdd, operator.add, 2).collect())
    assert summed == dict(rdd.reduceByKey(operator.add, 2).collect())


def spilling_side(values: bool) -> combine.Combine:
    """A side of the shuffle whose worker is always over its memory limit."""
    agg = Aggregator(to_list, append, extend)
    create, merge = (to_list, append) if values else (combine._same, extend)
    return combine.Combine(create, merge, agg, values, 0, CPickleSerializer())


def test_past_the_memory_limit_the_records_so_far_and_the_rest_go_to_the_spilling_merger(
    monkeypatch,
):
    monkeypatch.setattr(combine, "CHECK_EVERY", 100)
    records = [(i % 50, i) for i in range(1_000)]
    combined = spilling_side(True)(iter(records))
    assert not isinstance(combined, type({}.items()))  # ExternalMerger's items, not the dict's
    by_key = {k: sorted(v) for k, v in combined}
    assert by_key == {k: list(range(k, 1_000, 50)) for k in range(50)}

    halves = [(k, v[:10]) for k, v in by_key.items()] + [(k, v[10:]) for k, v in by_key.items()]
    merged = {k: sorted(v) for k, v in spilling_side(False)(iter(halves))}
    assert merged == by_key


def test_under_the_memory_limit_a_partition_is_combined_in_one_dict():
    agg = Aggregator(to_list, append, extend)
    side = combine.Combine(to_list, append, agg, True, 1 << 40, CPickleSerializer())
    words = "to be or not to be that is the question".split() * 30_000
    combined = side(iter((w, 1) for w in words))
    assert isinstance(combined, type({}.items()))
    assert {w: len(v) for w, v in combined} == Counter(words)


def test_a_key_error_from_the_users_function_is_raised_not_taken_for_a_new_key():
    """The loop finds a key by catching KeyError from its dict: one raised by the user's own
    function must still reach the task, not start the key afresh."""
    totals = {"a": 1}

    def merge_known(combined: int, value: str) -> int:
        return combined + totals[value]

    agg = Aggregator(int, merge_known, operator.add)
    side = combine.Combine(int, merge_known, agg, True, 1 << 40, CPickleSerializer())
    assert dict(side(iter([("k", "0"), ("k", "a")]))) == {"k": 1}
    with pytest.raises(KeyError, match="'b'"):
        side(iter([("k", "0"), ("k", "b")]))


class Settings:
    """A context's settings as `worker_memory_mb` reads them, counting the reads."""

    def __init__(self, memory: str):
        self.memory = memory
        self.reads = 0

    @property
    def _conf(self) -> Settings:
        return self

    def get(self, key: str, default: str) -> str:
        assert key == combine.WORKER_MEMORY
        self.reads += 1
        return self.memory


def test_the_worker_memory_is_read_once_per_context_and_each_context_has_its_own():
    small, large = Settings("100m"), Settings("2g")
    assert [combine.worker_memory_mb(c) for c in (small, large, small, large)] == [100, 2048] * 2
    assert (small.reads, large.reads) == (1, 1)
