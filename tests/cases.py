"""DStream operations with inputs and the outputs pyspark.streaming gives for them.

Each case runs on our engine in test_dstream_ops.py and, in test_pyspark_parity.py, on
pyspark.streaming itself in the same SparkContext, so "same results" is checked, not assumed.
Many inputs and expected outputs come from Apache Spark's
python/pyspark/streaming/tests/test_dstream.py (Apache-2.0; see NOTICE).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Case:
    name: str
    inputs: list[list[Any]]
    op: Callable[..., Any]
    expected: list[list[Any]]
    sort: bool = False
    inputs2: list[list[Any]] | None = None
    batch_seconds: float = 1.0
    stateful: bool = False


def _append(acc: list[Any], x: Any) -> list[Any]:
    return acc + [x]


def _update_sum(values: list[int], state: int | None) -> int:
    return sum(values) + (state or 0)


def _update_until_negative(values: list[int], state: int | None) -> int | None:
    total = sum(values) + (state or 0)
    return None if total < 0 else total


R1 = [list(range(1, 5)), list(range(5, 9)), list(range(9, 13))]
PAIRS = [
    [("a", 1), ("a", 1), ("b", 1), ("b", 1)],
    [("", 1), ("", 1), ("", 1), ("", 1)],
    [("x", 1), ("x", 1), ("y", 1), ("y", 1), ("z", 1)],
]
KV = [[("a", 2), ("b", 2), ("c", 1), ("d", 1)], [("e", 4), ("f", 1), ("g", 2), ("h", 3)]]
LEFT = [[("a", 1), ("b", 2), ("c", 3)], [("d", 4)]]
RIGHT = [[("b", "x"), ("c", "y"), ("e", "z")], [("d", "w"), ("d", "v")]]
RANGES = [list(range(n)) for n in range(1, 6)]


CASES: list[Case] = [
    Case("map", R1, lambda s: s.map(str), [[str(x) for x in b] for b in R1]),
    Case(
        "flatMap",
        R1,
        lambda s: s.flatMap(lambda x: (x, x * 2)),
        [[y for x in b for y in (x, x * 2)] for b in R1],
    ),
    Case(
        "filter",
        R1,
        lambda s: s.filter(lambda x: x % 2 == 0),
        [[x for x in b if x % 2 == 0] for b in R1],
    ),
    Case(
        "count",
        [list(range(5)), list(range(10)), list(range(20))],
        lambda s: s.count(),
        [[5], [10], [20]],
    ),
    Case("reduce", R1, lambda s: s.reduce(operator.add), [[10], [26], [42]]),
    Case(
        "reduceByKey",
        PAIRS,
        lambda s: s.reduceByKey(operator.add),
        [[("a", 2), ("b", 2)], [("", 4)], [("x", 2), ("y", 2), ("z", 1)]],
        sort=True,
    ),
    Case(
        "mapValues",
        KV,
        lambda s: s.mapValues(lambda v: v + 10),
        [
            [("a", 12), ("b", 12), ("c", 11), ("d", 11)],
            [("e", 14), ("f", 11), ("g", 12), ("h", 13)],
        ],
        sort=True,
    ),
    Case(
        "flatMapValues",
        [[("a", 2), ("b", 1)]],
        lambda s: s.flatMapValues(lambda v: (v, v + 10)),
        [[("a", 2), ("a", 12), ("b", 1), ("b", 11)]],
        sort=True,
    ),
    Case("glom", R1, lambda s: s.glom(), [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[9, 10], [11, 12]]]),
    Case(
        "mapPartitions",
        R1,
        lambda s: s.mapPartitions(lambda it: [sum(it)]),
        [[3, 7], [11, 15], [19, 23]],
    ),
    Case(
        "mapPartitionsWithIndex",
        R1,
        lambda s: s.mapPartitionsWithIndex(lambda i, it: [(i, sum(it))]),
        [[(0, 3), (1, 7)], [(0, 11), (1, 15)], [(0, 19), (1, 23)]],
    ),
    Case(
        "countByValue",
        [[1, 2, 2, 3, 3, 3], ["a", "a", "b", ""]],
        lambda s: s.countByValue(),
        [[(1, 1), (2, 2), (3, 3)], [("", 1), ("a", 2), ("b", 1)]],
        sort=True,
    ),
    Case(
        "groupByKey",
        PAIRS,
        lambda s: s.groupByKey().mapValues(sorted),
        [
            [("a", [1, 1]), ("b", [1, 1])],
            [("", [1, 1, 1, 1])],
            [("x", [1, 1]), ("y", [1, 1]), ("z", [1])],
        ],
        sort=True,
    ),
    Case(
        "combineByKey",
        PAIRS,
        lambda s: s.combineByKey(lambda v: [v], _append, operator.add),
        [
            [("a", [1, 1]), ("b", [1, 1])],
            [("", [1, 1, 1, 1])],
            [("x", [1, 1]), ("y", [1, 1]), ("z", [1])],
        ],
        sort=True,
    ),
    Case(
        "partitionBy",
        [[(1, "a"), (2, "b"), (3, "c"), (4, "d")]],
        lambda s: s.partitionBy(2, lambda k: k % 2).glom().map(sorted),
        [[[(2, "b"), (4, "d")], [(1, "a"), (3, "c")]]],
    ),
    Case(
        "repartition",
        R1,
        lambda s: s.repartition(1).glom().map(sorted),
        [[[1, 2, 3, 4]], [[5, 6, 7, 8]], [[9, 10, 11, 12]]],
    ),
    Case(
        "union",
        [[1, 2], [3]],
        lambda a, b: a.union(b),
        [[1, 2, 10], [3, 20, 30]],
        sort=True,
        inputs2=[[10], [20, 30]],
    ),
    Case(
        "cogroup",
        LEFT,
        lambda a, b: a.cogroup(b).mapValues(lambda vs: tuple(sorted(v) for v in vs)),
        [
            [("a", ([1], [])), ("b", ([2], ["x"])), ("c", ([3], ["y"])), ("e", ([], ["z"]))],
            [("d", ([4], ["v", "w"]))],
        ],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "join",
        LEFT,
        lambda a, b: a.join(b),
        [[("b", (2, "x")), ("c", (3, "y"))], [("d", (4, "v")), ("d", (4, "w"))]],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "leftOuterJoin",
        LEFT,
        lambda a, b: a.leftOuterJoin(b),
        [[("a", (1, None)), ("b", (2, "x")), ("c", (3, "y"))], [("d", (4, "v")), ("d", (4, "w"))]],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "rightOuterJoin",
        LEFT,
        lambda a, b: a.rightOuterJoin(b),
        [
            [("b", (2, "x")), ("c", (3, "y")), ("e", (None, "z"))],
            [("d", (4, "v")), ("d", (4, "w"))],
        ],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "fullOuterJoin",
        LEFT,
        lambda a, b: a.fullOuterJoin(b),
        [
            [("a", (1, None)), ("b", (2, "x")), ("c", (3, "y")), ("e", (None, "z"))],
            [("d", (4, "v")), ("d", (4, "w"))],
        ],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "transform",
        R1,
        lambda s: s.transform(lambda rdd: rdd.map(lambda x: -x)),
        [[-x for x in b] for b in R1],
    ),
    Case(
        "transformWithTime",
        R1,
        lambda s: s.transform(lambda t, rdd: rdd.map(lambda x: x * 0)),
        [[0] * len(b) for b in R1],
    ),
    Case(
        "transformWith",
        LEFT,
        lambda a, b: a.transformWith(lambda x, y: x.keys().union(y.keys()), b),
        [["a", "b", "b", "c", "c", "e"], ["d", "d", "d"]],
        sort=True,
        inputs2=RIGHT,
    ),
    Case(
        "window",
        RANGES,
        lambda s: s.window(1.5, 0.5).count(),
        [[1], [3], [6], [9], [12], [9], [5]],
        batch_seconds=0.5,
    ),
    Case(
        "window-default-slide",
        [[1], [2], [3], [4]],
        lambda s: s.window(2).map(lambda x: x),
        [[1], [1, 2], [2, 3], [3, 4], [4], []],
        sort=True,
    ),
    Case(
        "countByWindow",
        RANGES,
        lambda s: s.countByWindow(1.5, 0.5),
        [[1], [3], [6], [9], [12], [9], [5]],
        batch_seconds=0.5,
        stateful=True,
    ),
    Case(
        "countByWindow-large",
        [list(range(n)) for n in range(1, 6)],
        lambda s: s.countByWindow(2.5, 0.5),
        [[1], [3], [6], [10], [15], [14], [12], [9], [5], [0]],
        batch_seconds=0.5,
        stateful=True,
    ),
    Case(
        "reduceByWindow",
        [[1], [2], [3], [4]],
        lambda s: s.reduceByWindow(operator.add, None, 2, 1),
        [[1], [3], [5], [7], [4]],
    ),
    Case(
        "countByValueAndWindow",
        [list(range(n)) for n in range(1, 7)],
        lambda s: s.countByValueAndWindow(2.5, 0.5).count(),
        [[1], [2], [3], [4], [5], [6], [6], [6], [6], [6]],
        batch_seconds=0.5,
        stateful=True,
    ),
    Case(
        "groupByKeyAndWindow",
        [[("a", i)] for i in range(5)],
        lambda s: s.groupByKeyAndWindow(1.5, 0.5).mapValues(sorted),
        [
            [("a", [0])],
            [("a", [0, 1])],
            [("a", [0, 1, 2])],
            [("a", [1, 2, 3])],
            [("a", [2, 3, 4])],
            [("a", [3, 4])],
            [("a", [4])],
        ],
        batch_seconds=0.5,
        stateful=True,
    ),
    Case(
        "reduceByKeyAndWindow-inverse",
        [[("a", 1)]] * 7 + [[]] * 6,
        lambda s: s.reduceByKeyAndWindow(operator.add, operator.sub, 5, 1),
        [[("a", n)] for n in (1, 2, 3, 4, 5, 5, 5, 4, 3, 2, 1, 0, 0)],
        stateful=True,
    ),
    Case(
        "reduceByKeyAndWindow-filter",
        [[("a", 1), ("b", 1)]] * 3 + [[("a", 1)]] * 6,
        lambda s: s.reduceByKeyAndWindow(
            operator.add, operator.sub, 5, 1, filterFunc=lambda kv: kv[1] > 0
        ),
        [
            [("a", 1), ("b", 1)],
            [("a", 2), ("b", 2)],
            [("a", 3), ("b", 3)],
            [("a", 4), ("b", 3)],
            [("a", 5), ("b", 3)],
            [("a", 5), ("b", 2)],
            [("a", 5), ("b", 1)],
            [("a", 5)],
            [("a", 5)],
        ],
        sort=True,
        stateful=True,
    ),
    Case(
        "reduceByKeyAndWindow-noinverse",
        [[("a", 1)], [("a", 2)], [("b", 3)], []],
        lambda s: s.reduceByKeyAndWindow(operator.add, None, 2, 1),
        [[("a", 1)], [("a", 3)], [("a", 2), ("b", 3)], [("b", 3)], []],
        sort=True,
    ),
    Case(
        "updateStateByKey",
        [[("a", 1)], [("a", 2), ("b", 1)], [], [("b", -5)]],
        lambda s: s.updateStateByKey(_update_until_negative),
        [[("a", 1)], [("a", 3), ("b", 1)], [("a", 3), ("b", 1)], [("a", 3)]],
        sort=True,
        stateful=True,
    ),
]

INITIAL_STATE = [("a", 100), ("z", 7)]

STATE_WITH_INITIAL = Case(
    "updateStateByKey-initialRDD",
    [[("a", 1)], [("b", 2)]],
    lambda s: s.updateStateByKey(
        _update_sum, initialRDD=s.context().sparkContext.parallelize(INITIAL_STATE)
    ),
    [[("a", 101), ("z", 7)], [("a", 101), ("b", 2), ("z", 7)]],
    sort=True,
    stateful=True,
)
CASES.append(STATE_WITH_INITIAL)
