"""The chaos suite's readings that need no cluster: the figures read once a run is over."""

import json
import math

from e2e.chaos.faults import Chaos, Figures, Target
from e2e.chaos.observer import Snapshot


def test_each_fault_is_read_for_good_up_to_the_next_one_not_up_to_itself():
    """Two executor losses at 10 s and 40 s, 6 s batches, baseline 2 s: the first is on
    schedule for good from the 30 s batch (the late 18 s and 24 s batches before it; the 42 s
    batch, committed after the second loss, not read for it); the second never is."""
    target = Target("ns", "job", 2, 6.0, "ops", "release", "lease")
    chaos = Chaos(cluster=None, observer=None, target=target)  # type: ignore[arg-type]
    chaos.baseline_delay = 2.0
    for at in (10.0, 40.0):
        chaos.count("executor", at)
        chaos.read_for_good.append(("executor-loss on schedule for good", at))
    commits = {12000: 14.0, 18000: 27.0, 24000: 33.0, 30000: 33.5, 36000: 38.0, 42000: 52.0}
    snapshot = Snapshot(ranges={}, coalesced={}, commits=commits, max_drivers=1, epochs={})
    chaos.figures_for_good(snapshot)
    assert chaos.figures.values["executor-loss on schedule for good"] == [33.5 - 10.0, math.inf]
    assert chaos.figures.notes[-2:] == [
        "executor-loss on schedule for good: 23.5 s (up to the next fault)",
        "executor-loss on schedule for good: inf s (up to the end of the run)",
    ]


def test_a_fault_never_back_is_null_in_the_json_report_not_infinity():
    figures = Figures()
    figures.add("executor-loss on schedule for good", 23.5, "up to the next fault")
    figures.add("executor-loss on schedule for good", math.inf, "up to the end of the run")
    text = json.dumps(figures.as_json(), allow_nan=False)  # strict JSON: raises on Infinity
    assert json.loads(text) == {"executor-loss on schedule for good": [23.5, None]}
