"""Word counts three ways, in one output stream: per batch, as running totals, and over a window.

The chaos end-to-end suite (e2e/) runs this job and checks every committed batch against counts
computed straight from the rate source's input. Each output record is ((kind, key), count):
- ("count", word): the batch's own word counts;
- ("total", letter): running total of the words starting with each letter, kept with
  updateStateByKey (a small state: one key per initial letter);
- ("window", word): counts over the last `window` seconds, kept incrementally (add the entering
  batch, subtract the leaving one).
One stream means one directory per batch from the files sink, so a committed batch holds all three.
"""

from __future__ import annotations

from operator import add, sub
from typing import Any


def add_counts(new: list[int], total: int | None) -> int:
    return (total or 0) + sum(new)


def build(ssc: Any, lines: Any, args: dict[str, Any]) -> Any:
    counts = lines.flatMap(lambda line: ((word, 1) for word in line.split())).reduceByKey(add)
    counts = counts.cache()  # read by all three outputs
    totals = counts.map(lambda kv: (kv[0][0], kv[1])).updateStateByKey(add_counts)
    windowed = counts.reduceByKeyAndWindow(
        add, sub, float(args.get("window", 10)), None, filterFunc=lambda kv: kv[1] > 0
    )
    return ssc.union(
        counts.map(lambda kv: (("count", kv[0]), kv[1])),
        totals.map(lambda kv: (("total", kv[0]), kv[1])),
        windowed.map(lambda kv: (("window", kv[0]), kv[1])),
    )
