"""The overload-step benchmark's runners on real Spark: each system's program runs a few batches
and its output checker passes, so `make bench-backpressure` cannot rot unnoticed between its runs
on a quiet machine (its figures are not measured here)."""

from __future__ import annotations

import pytest

from bench.backpressure.overload import output_problems
from bench.backpressure.step import RUNNERS, Run


@pytest.mark.parametrize("system", sorted(RUNNERS))
def test_each_runner_outputs_the_counts_of_what_it_admitted(sc, system):
    run = Run(interval_s=0.5)
    _schedule, stop = RUNNERS[system](sc).start(2_000, run)
    run.wait_batches(4, timeout_s=90)
    ended = stop()
    admitted = {round(b["time_s"] * 1000): b["records"] for b in run.batches}
    assert len(admitted) >= 4 and sum(admitted.values()) > 0
    expected = ended["expected"]()
    problems = output_problems(
        run.outputs, admitted, expected, ended["handed_out"], ended["all_completed"]
    )
    assert problems == []
