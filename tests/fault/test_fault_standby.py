"""A hot standby takes a job over, and a frozen leader that wakes up commits nothing.

One checkpoint, three drivers in turn, the rate source producing throughout:
1. leader A runs; standby B (`dstream run --standby`) starts and waits, following the
   checkpoint. A's whole process group is frozen (SIGSTOP): it keeps its kernel lock but stops
   renewing its lease, so B takes over once the lease has expired. A is thawed (SIGCONT): it
   finds the newer epoch and exits 6 naming it, having committed nothing after the takeover.
2. standby C starts and waits; B's process group is killed (SIGKILL): the kernel frees B's
   lock and C takes over within a poll.
3. C commits a batch it planned itself and is stopped gracefully; every committed batch is
   then compared with the reference computed from the input offsets (harness.verify).
The takeover times (fault to the new leader's first committed batch) are printed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
from harness import Driver, RateJob, fault_seed, verify

LEASE_S = 5
STEP_TIMEOUT_S = 240
LEASE_CONF = ("--conf", f"spark.dstream.lease.durationSeconds={LEASE_S}")
TIMELINE = re.compile(r"recovery timeline: phase=(\w+) at=([\d.]+)")


def is_batch(text: str) -> bool:
    return text.startswith("batch ") and "FAILED" not in text


def leading(text: str) -> bool:
    return "leading checkpoint" in text


def waiting(text: str) -> bool:
    return "standby: waiting for the lead" in text


def commits_by_epoch(job: RateJob) -> dict[int, int]:
    """Every commit marker in the log: batch time -> the epoch it was written under."""
    found = {}
    for path in (job.checkpoint / "log").glob("commit-*.json"):
        body = json.loads(path.read_text())["body"]
        found[body["time"]] = body.get("epoch", 0)
    return found


def start(job: RateJob, *args: str) -> Driver:
    return Driver(job.manifest, *LEASE_CONF, *args, log=job.root / "drivers.log").start()


def takeover(standby: Driver, fault_at: float) -> str:
    """The standby's first committed batch after the fault, and its timeline, as a line."""
    first = standby.wait_for_line(is_batch, STEP_TIMEOUT_S)
    phases = [
        f"{m.group(1)}=+{float(m.group(2)) - fault_at:.1f}s"
        for line in standby.lines
        if (m := TIMELINE.search(line.text)) and float(m.group(2)) >= fault_at - 1
    ]
    return f"first batch +{first.at - monotonic_of(fault_at):.1f}s ({', '.join(phases)})"


def monotonic_of(wall: float) -> float:
    """A wall-clock instant on the monotonic clock the drivers' lines are stamped with."""
    return time.monotonic() - (time.time() - wall)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_standby_takes_over_a_frozen_then_a_killed_leader_output_exact(tmp_path):
    seed = fault_seed()
    job = RateJob(tmp_path, batch_s=2, window_s=10, checkpoint_interval_s=4, seed=seed % 1000)
    job.write()
    leader = start(job)
    standby = second = None
    try:
        leader.wait_for_line(is_batch, STEP_TIMEOUT_S)
        standby = start(job, "--standby")
        standby.wait_for_line(waiting, STEP_TIMEOUT_S)
        leader.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(leader.lines))

        signal_group(leader, signal.SIGSTOP)
        frozen_at = time.time()
        before = commits_by_epoch(job)
        standby.wait_for_line(leading, STEP_TIMEOUT_S)
        frozen = takeover(standby, frozen_at)
        standby.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(standby.lines))
        thawed_from = len(leader.lines)
        signal_group(leader, signal.SIGCONT)
        assert leader.wait(STEP_TIMEOUT_S) == 6
        after_thaw = [line.text for line in leader.lines[thawed_from:]]
        assert any("deposed: epoch 2 was claimed" in text for text in after_thaw), after_thaw
        late = {t: e for t, e in commits_by_epoch(job).items() if e < 2 and t not in before}
        assert not late, f"commits of the deposed epoch after the takeover: {late}"

        second = start(job, "--standby")
        second.wait_for_line(waiting, STEP_TIMEOUT_S)
        killed_at = time.time()
        standby.kill()
        killed = takeover(second, killed_at)
        second.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(second.lines))
        assert second.terminate(timeout_s=120) == 0
    finally:
        for driver in (leader, standby, second):
            if driver is not None:
                signal_group(driver, signal.SIGCONT)
                driver.kill()
    verdict = verify(job)
    print(f"\ntakeover of a frozen leader (lease {LEASE_S} s): {frozen}")
    print(f"takeover of a killed leader: {killed}")
    print(f"batches={verdict.batches} lost={verdict.lost} duplicated={verdict.duplicated}")
    assert sorted(set(commits_by_epoch(job).values()))[-1] == 3
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0


def signal_group(driver: Driver, sig: int) -> None:
    try:
        os.killpg(driver.pid, sig)
    except ProcessLookupError:
        pass
