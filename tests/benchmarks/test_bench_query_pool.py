"""`python -m bench.throughput query-pool`'s verdict, kept free of Spark: which batches ran
during the query, and whether the run meets the pools' aim or cannot tell."""

from __future__ import annotations

from datetime import datetime

from bench.throughput.query_pool import ran_during, verdict


def batch(at: str, delay_s: float, processing_s: float) -> dict:
    return {
        "time": f"2026-12-06T10:00:{at}+00:00",
        "schedulingDelaySeconds": delay_s,
        "processingSeconds": processing_s,
        "records": 1000,
    }


def test_the_batches_that_overlap_the_query_are_the_ones_judged():
    before, overlapping, inside, after = (
        batch("01", 0.0, 0.5),  # ran 01.0-01.5
        batch("02", 0.5, 1.0),  # ran 02.5-03.5
        batch("04", 0.0, 0.5),  # ran 04.0-04.5
        batch("09", 0.0, 0.5),  # ran 09.0-09.5
    )
    asked = datetime.fromisoformat("2026-12-06T10:00:03+00:00").timestamp()
    during = ran_during([after, inside, overlapping, before], asked, asked + 5)
    assert during == [overlapping, inside]


def test_a_run_passes_only_with_a_heavy_query_and_every_batch_within_two_intervals():
    fast, slow = batch("04", 0.0, 0.4), batch("05", 0.0, 2.5)
    assert verdict(8.0, [fast]) is None
    assert "not heavy enough" in verdict(2.0, [fast])
    assert "no batch" in verdict(8.0, [])
    assert "2.50 s: over 2 intervals" in verdict(8.0, [fast, slow])
