"""An incremental window's step (dstream/worker/window_step.py): the old window's values plain,
the changing batches' wrapped, told apart by type whatever the user's values look like."""

from __future__ import annotations

import pickle

from dstream.runtime.checkpoint import durable
from dstream.worker.window_step import Entering, Leaving, WindowStep
from streams import manual_context, run_batches


def pair_sub(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] - b[0], a[1] - b[1]


def pair_add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


def test_a_step_subtracts_what_leaves_and_adds_what_enters_in_any_order():
    """Values shaped like tags (a (0|1|2, x) pair) stay the window's values."""
    records = [
        ("b", Entering((1, 5))),
        ("a", (2, 10)),
        ("a", Leaving((1, 4))),
        ("b", (1, 1)),
        ("c", Entering((0, 7))),
        ("gone", Leaving((1, 1))),  # not in the old window: nothing to subtract from
    ]
    step = WindowStep(pair_add, pair_sub, None)
    assert sorted(step(0, records)) == [("a", (1, 6)), ("b", (2, 6)), ("c", (0, 7))]
    keep = WindowStep(pair_add, pair_sub, lambda kv: kv[1][0] > 0)
    assert sorted(keep(0, records)) == [("a", (1, 6)), ("b", (2, 6))]


def test_a_step_reads_its_partitions_part_of_each_durable_leaving_batch(tmp_path):
    """Partition 1 reads part 1 of each batch (not part 0), and two batches leaving at once
    are reduced together before they are subtracted, as with the tagged ones."""
    batches = []
    for n, parts in enumerate([[[("x", (9, 9))], [("a", (1, 1))]], [[], [("a", (1, 2))]]]):
        directory = str(tmp_path / f"batch-{n}")
        for index, records in enumerate(parts):
            list(durable.PartWriter(directory, 2)(index, iter(records)))
        batches.append(durable.PartReader(directory, 2))
    step = WindowStep(pair_add, pair_sub, None, tuple(batches))
    records = [("a", (5, 10)), ("a", Leaving((1, 3))), ("x", (1, 1))]
    assert sorted(step(1, records)) == [("a", (2, 4)), ("x", (1, 1))]


def test_a_change_survives_pickling_as_itself():
    for change in (Leaving([1, None]), Entering(("x", 2))):
        copy = pickle.loads(pickle.dumps(change, pickle.HIGHEST_PROTOCOL))
        assert type(copy) is type(change) and copy.value == change.value


def test_a_window_of_pairs_steps_exactly(sc, tmp_path):
    """(count, sum) per key over a 5-batch window sliding by one, with its durable batches:
    every window equals the sums of its batches, recomputed here."""
    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    batches = [[(k % 3, (1, k)) for k in range(n, n + 4)] for n in range(9)]
    pairs = ssc.queueStream([sc.parallelize(b, 2) for b in batches], oneAtATime=True)
    windowed = pairs.reduceByKeyAndWindow(pair_add, pair_sub, 5, 1, 2)
    got: list[list[tuple[int, tuple[int, int]]]] = []
    windowed.foreachRDD(lambda rdd: got.append(sorted(rdd.collect())))
    run_batches(ssc, len(batches))
    for end, window in enumerate(got, start=1):
        expected: dict[int, tuple[int, int]] = {}
        for key, value in (kv for b in batches[max(0, end - 5) : end] for kv in b):
            expected[key] = pair_add(expected.get(key, (0, 0)), value)
        assert window == sorted(expected.items()), end
    assert len(got) == len(batches)
