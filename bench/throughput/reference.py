"""What each workload's output must be, computed in plain Python from the same input lines.

A trial's outputs are digests (`programs`): a grep count, a window's word-count digest
(distinct words, total count, a checksum over every (word, count) pair) or the top-k list. The
reference here recomputes them from `feed.batch_slices` and `textgen.lines`, without Spark and
without any engine code, so an engine that drops, duplicates or misplaces records fails its trial.
Where a batch holds what a broker had, not an interval (`kafka_input`), the reference is computed
from the offsets the batch read (`expected_of`).

`restricted=True` is the semantics of Structured Streaming's update mode on a sliding window:
a micro-batch outputs the window's counts only for the words that occur in that micro-batch.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from bench.common import RECORD_BYTES, SEED, textgen
from bench.throughput import feed

GREP_PATTERN = "bab"  # in about a quarter of the lines
WINDOW_BATCHES = 30
TOP_K = 10


def word_checksum(word: str) -> int:
    """A word's weight in the checksum; Spark SQL's crc32 gives the same number."""
    return zlib.crc32(word.encode())


def count_digest(counts: dict[str, int]) -> list[int]:
    """[distinct words, total count, sum of crc32(word) * count] over positive counts."""
    positive = {w: c for w, c in counts.items() if c > 0}
    checksum = sum(word_checksum(w) * c for w, c in positive.items())
    return [len(positive), sum(positive.values()), checksum]


def top_k(counts: dict[str, int], k: int = TOP_K) -> list[list[Any]]:
    """The k largest counts, ties broken by word (as every system's output orders them)."""
    ranked = sorted((kv for kv in counts.items() if kv[1] > 0), key=lambda kv: (-kv[1], kv[0]))
    return [[w, c] for w, c in ranked[:k]]


# A batch's input: (partition, start offset, end offset) of each of its slices.
Slices = tuple[tuple[int, int, int], ...]


@lru_cache(maxsize=128)
def slice_lines(slices: Slices) -> Counter[str]:
    """How often each line occurs in the records of `slices` (record (p, n) is textgen's line
    of partition p, offset n: the rate source's, and the Kafka feeder's offset n of p)."""
    lines: Counter[str] = Counter()
    for partition, start, end in slices:
        lines.update(textgen.lines(SEED, RECORD_BYTES, partition, start, end))
    return lines


@lru_cache(maxsize=128)
def slice_words(slices: Slices) -> Counter[str]:
    words: Counter[str] = Counter()
    for line, times in slice_lines(slices).items():
        for word in line.split():
            words[word] += times
    return words


def interval_slices(rate: int, partitions: int, k: int, batch_ms: int = 1000) -> Slices:
    """The records of interval k (1-based) of a stream at `rate` records/s."""
    return tuple(feed.batch_slices(rate, partitions, k, batch_ms))


def window_of(k: int, batch_ms: int = 1000) -> range:
    """The batches of the window (WINDOW_BATCHES seconds) ending with batch k (those that
    exist)."""
    return range(max(1, k - WINDOW_BATCHES * 1000 // batch_ms + 1), k + 1)


def expected_of(workload: str, window: list[Slices], restricted: bool = False) -> Any:
    """The digest of the output whose own batch's input is window[-1] and whose window's
    inputs are `window` (only the last counts for grep)."""
    if workload in ("grep", "grep-jvm"):  # programs.GREPS: the same lines, made elsewhere
        return sum(n for line, n in slice_lines(window[-1]).items() if GREP_PATTERN in line)
    counts: Counter[str] = Counter()
    for slices in window:
        counts.update(slice_words(slices))
    if restricted:
        present = slice_words(window[-1])
        counts = Counter({w: c for w, c in counts.items() if w in present})
    return count_digest(counts) if workload == "wordcount" else top_k(counts)


def expected(
    workload: str, rate: int, partitions: int, k: int, restricted: bool, batch_ms: int = 1000
) -> Any:
    """The digest batch k's output must have, batch j holding interval j."""
    window = [interval_slices(rate, partitions, j, batch_ms) for j in window_of(k, batch_ms)]
    return expected_of(workload, window, restricted)


@dataclass
class Check:
    ok: bool
    reason: str
    checked: list[int]  # the batches compared


def sample_batches(done: list[int], samples: int) -> list[int]:
    """`samples` batch numbers spread over the completed ones, always including the last."""
    if not done:
        return []
    ordered = sorted(done)
    if len(ordered) <= samples:
        return ordered
    step = (len(ordered) - 1) / (samples - 1) if samples > 1 else 0
    picked = {ordered[round(len(ordered) - 1 - i * step)] for i in range(samples)}
    return sorted(picked)


def check_outputs(
    workload: str,
    rate: int,
    partitions: int,
    outputs: dict[int, Any],
    measured: list[int],
    samples: int = 4,
    restricted: bool = False,
    batch_ms: int = 1000,
    inputs: dict[int, Slices] | None = None,
) -> Check:
    """Compare sampled measured batches' outputs with the reference; a missing or empty output
    is wrong too (a system that printed nothing has not done the work). Batch k holds
    interval k, or, where `inputs` is given (a broker's batches hold what had arrived), the
    slices recorded for it."""
    if not measured:
        return Check(False, "no batch completed", [])
    checked = sample_batches(measured, samples)
    for k in checked:
        if inputs is None:
            want = expected(workload, rate, partitions, k, restricted, batch_ms)
        else:
            unknown = [j for j in window_of(k, batch_ms) if j not in inputs]
            if unknown:
                return Check(False, f"batch {unknown[0]}: its input was not recorded", checked)
            window = [inputs[j] for j in window_of(k, batch_ms)]
            want = expected_of(workload, window, restricted)
        got = outputs.get(k)
        if got is None:
            return Check(False, f"batch {k}: no output", checked)
        if got != want:
            return Check(
                False, f"batch {k}: output {_short(got)} != expected {_short(want)}", checked
            )
    return Check(True, "ok", checked)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
