"""The benchmark's user programs for the DStream API, one text for dstream and pyspark.streaming.

dstream runs pyspark.streaming programs unchanged, so both systems run these very functions on
the `lines` stream of their StreamingContext; only which StreamingContext made the stream
differs. Two variants of each workload:
- "tutorial": the program as the Spark Streaming guide writes it (lambdas per record);
- "tuned": what an expert writes: each partition pre-aggregated in one Python pass (a Counter,
  or one count per partition), then the same windowed reduction with an inverse function.

Every output is reduced to a small digest on the driver (`OUTPUTS`, keyed by batch time) that
`reference` checks: a grep count, a word-count digest, or the top-k list. The digest costs
both systems the same (one pass over the window's ~10,000 words, or `takeOrdered`).
Functions here are module-level so that Spark pickles them by reference (pyspark.streaming
checkpoints its graph's functions).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from typing import Any

from bench.throughput.reference import GREP_PATTERN, TOP_K, WINDOW_BATCHES, word_checksum

WORKLOADS = ("grep", "grep-jvm", "wordcount", "topk")
VARIANTS = ("tutorial", "tuned")
GREPS = ("grep", "grep-jvm")  # the same program; its lines made in Python, or in the JVM
JVM_LINES = ("grep-jvm",)  # the workloads whose lines every system makes in the JVM

# Digests of completed batches on this driver: batch time (ms) -> digest.
OUTPUTS: dict[int, Any] = {}


def count_words(lines: Iterable[str]) -> Iterator[tuple[str, int]]:
    """One partition's word counts, in one pass."""
    return iter(Counter(chain.from_iterable(map(str.split, lines))).items())


def count_matches(lines: Iterable[str]) -> list[int]:
    pattern = GREP_PATTERN
    return [sum(1 for line in lines if pattern in line)]


def positive(kv: tuple[str, int]) -> bool:
    return kv[1] > 0


def windowed_counts(lines: Any, variant: str, batch_s: float = 1) -> Any:
    """Word counts over the last WINDOW_BATCHES seconds, sliding every batch (of batch_s)."""
    if variant == "tutorial":
        pairs = lines.flatMap(lambda line: line.split()).map(lambda word: (word, 1))
        return pairs.reduceByKeyAndWindow(
            lambda a, b: a + b, lambda a, b: a - b, WINDOW_BATCHES, batch_s
        )
    return lines.mapPartitions(count_words).reduceByKeyAndWindow(
        operator.add, operator.sub, WINDOW_BATCHES, batch_s, filterFunc=positive
    )


def grep_counts(lines: Any, variant: str) -> Any:
    if variant == "tutorial":
        return lines.filter(lambda line: GREP_PATTERN in line).count()
    return lines.mapPartitions(count_matches).reduce(operator.add)


def build(workload: str, variant: str, lines: Any, batch_s: float = 1) -> None:
    """The program: `workload` in `variant` on `lines`, its digest recorded per batch."""
    if workload in GREPS:
        grep_counts(lines, variant).foreachRDD(recorder(grep_digest))
    else:
        digest = count_digest if workload == "wordcount" else top_digest
        windowed_counts(lines, variant, batch_s).foreachRDD(recorder(digest))


def recorder(digest: Callable[[Any], Any]) -> Callable[[Any, Any], None]:
    """The output operation: the batch's digest into OUTPUTS (a plain two-argument function,
    as pyspark.streaming's foreachRDD inspects its arity)."""

    def record(time: Any, rdd: Any) -> None:
        OUTPUTS[round(time.timestamp() * 1000)] = digest(rdd)

    return record


def grep_digest(rdd: Any) -> int:
    return sum(rdd.collect())


def partial_count_digest(pairs: Iterable[tuple[str, int]]) -> list[list[int]]:
    distinct = total = checksum = 0
    for word, count in pairs:
        if count > 0:
            distinct += 1
            total += count
            checksum += word_checksum(word) * count
    return [[distinct, total, checksum]]


def count_digest(rdd: Any) -> list[int]:
    parts = rdd.mapPartitions(partial_count_digest).collect()
    return [sum(p[i] for p in parts) for i in range(3)]


def rank(kv: tuple[str, int]) -> tuple[int, str]:
    return -kv[1], kv[0]


def top_digest(rdd: Any) -> list[list[Any]]:
    return [[w, c] for w, c in rdd.filter(positive).takeOrdered(TOP_K, key=rank)]
