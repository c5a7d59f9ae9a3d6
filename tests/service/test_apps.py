"""Built-in apps on the rate source, checked against counts computed directly from its records."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from dstream.service.apps import build_app
from dstream.spec import App
from dstream.worker import textgen
from streams import collect, manual_context

RATE, PARTITIONS, SEED, SIZE = 400, 2, 11, 60


def batch_lines(batch: int) -> list[str]:
    """The records the rate source admits in batch `batch` (1-based) at 1 s batches."""
    per_partition = RATE // PARTITIONS
    start, end = (batch - 1) * per_partition, batch * per_partition
    return [
        line
        for partition in range(PARTITIONS)
        for line in textgen.lines(SEED, SIZE, partition, start, end)
    ]


def run_app(sc, app: App, batches: int) -> list[list]:
    ssc = manual_context(sc)
    source = ssc.rateStream(RATE, PARTITIONS, SEED, SIZE)
    (output,) = build_app(ssc, source, app)
    return collect(output, batches)


def test_wordcount_per_batch(sc):
    results = run_app(sc, App(builtin="wordcount"), 2)
    for batch, counts in enumerate(results, start=1):
        assert dict(counts) == Counter(w for line in batch_lines(batch) for w in line.split())


def test_wordcount_over_a_window(sc, tmp_path):
    ssc = manual_context(sc)
    ssc.checkpoint(str(tmp_path))
    (output,) = build_app(
        ssc,
        ssc.rateStream(RATE, PARTITIONS, SEED, SIZE),
        App(builtin="wordcount", args={"window": "2s", "slide": "1s"}),
    )
    results = collect(output, 3)
    for batch, counts in enumerate(results, start=1):
        window = [line for b in range(max(1, batch - 1), batch + 1) for line in batch_lines(b)]
        assert dict(counts) == Counter(w for line in window for w in line.split())


def test_grep_counts_matching_lines(sc):
    pattern = r"\bba\b"
    results = run_app(sc, App(builtin="grep", args={"pattern": pattern}), 2)
    expected = [[sum(1 for line in batch_lines(b) if re.search(pattern, line))] for b in (1, 2)]
    assert results == expected


def test_topk_over_the_window(sc, tmp_path):
    results = run_app(sc, App(builtin="topk", args={"k": 3, "window": "2s"}), 2)
    for batch, top in enumerate(results, start=1):
        window = [line for b in range(1, batch + 1) for line in batch_lines(b)]
        counts = Counter(w for line in window for w in line.split())
        assert top == sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:3]


def test_sessions_counts_events_per_active_user(sc):
    results = run_app(sc, App(builtin="sessions", args={"timeout": "5s"}), 2)
    seen: Counter = Counter()
    for batch, active in enumerate(results, start=1):
        seen.update(line.split()[0] for line in batch_lines(batch))
        assert dict(active) == seen


def test_user_module_must_return_streams(sc):
    ssc = manual_context(sc)
    with pytest.raises(ImportError, match="has no attribute 'nope'"):
        build_app(ssc, ssc.queueStream([[1]]), App(module="dstream.service.apps:nope"))
