"""The committed output against a fault-free reference computed from the same input.

The rate source's records are a pure function of (seed, partition, offset) (`dstream.worker.textgen`),
and the checkpoint recorded each batch's offsets, so the reference needs no second run:
- committed batch times follow each other by one interval, except where a batch lists the times
  between it and its predecessor as coalesced (backpressure merged late times into it);
- every committed batch's ("count", word) output must equal the word counts of its own input;
- ("total", letter) must equal the running total over all batches up to it;
- ("window", word) must equal the counts of the batches inside its window;
- over all committed batches, the union of per-batch counts against the counts of every record
  the source produced up to the last committed offset: words missing are `lost`, words counted
  more than once are `duplicated` (a skipped or repeated input range shows up here).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise

from dstream.worker import textgen

from e2e.chaos.observer import Snapshot


@dataclass(frozen=True)
class Input:
    """The job's rate source settings that decide its records."""

    seed: int
    record_bytes: int
    partitions: int


@dataclass
class Verdict:
    batches: int = 0
    records: int = 0
    words: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.batches > 0 and not self.lost and not self.duplicated and not self.problems


def word_counts(source: Input, ranges: list[list[int]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for partition, (start, end) in enumerate(ranges):
        for line in textgen.lines(source.seed, source.record_bytes, partition, start, end):
            counts.update(line.split())
    return counts


def split_outputs(lines: list[str]) -> dict[str, dict[str, int]]:
    """One batch directory's JSON lines as {"count": {...}, "total": {...}, "window": {...}}."""
    found: dict[str, dict[str, int]] = {"count": {}, "total": {}, "window": {}}
    for text in lines:
        record = json.loads(text)
        kind, key = record["key"]
        if key in found[kind]:
            raise ValueError(f"{kind} {key!r} appears twice")
        found[kind][key] = record["value"]
    return found


def unexplained_gaps(
    committed: list[int], coalesced: dict[int, list[int]], batch_ms: int
) -> list[int]:
    """Batch times whose next committed batch is not one interval later and does not list every
    time in between as coalesced into it."""
    return [
        t
        for t, u in pairwise(committed)
        if coalesced.get(u, []) != list(range(t + batch_ms, u, batch_ms))
    ]


def verify(
    source: Input,
    snapshot: Snapshot,
    outputs: dict[int, list[str]],
    batch_ms: int,
    window_ms: int,
) -> Verdict:
    verdict = Verdict()
    committed = sorted(snapshot.commits)
    if not committed:
        verdict.problems.append("no batch committed")
        return verdict
    missing = [t for t in committed if t not in snapshot.ranges or t not in outputs]
    if missing:
        verdict.problems.append(f"committed batches without a seen record or output: {missing}")
        return verdict
    gaps = unexplained_gaps(committed, snapshot.coalesced, batch_ms)
    if gaps:
        verdict.problems.append(f"batch times missing after {gaps}")
    expected = {t: word_counts(source, snapshot.ranges[t]) for t in committed}
    union: Counter[str] = Counter()
    totals: Counter[str] = Counter()
    for t in committed:
        try:
            output = split_outputs(outputs[t])
        except ValueError as error:
            verdict.problems.append(f"batch {t}: {error}")
            continue
        union.update(output["count"])
        for word, n in expected[t].items():
            totals[word[0]] += n
        window = sum((expected[u] for u in committed if t - window_ms < u <= t), Counter())
        for kind, want in (("count", expected[t]), ("total", totals), ("window", window)):
            if output[kind] != {k: v for k, v in want.items() if v > 0}:
                verdict.problems.append(f"batch {t}: {kind} differs from the reference")
    ends = [max(snapshot.ranges[t][p][1] for t in committed) for p in range(source.partitions)]
    reference = word_counts(source, [[0, end] for end in ends])
    verdict.batches, verdict.records = len(committed), sum(ends)
    verdict.words = sum(reference.values())
    verdict.lost = sum((reference - union).values())
    verdict.duplicated = sum((union - reference).values())
    return verdict
