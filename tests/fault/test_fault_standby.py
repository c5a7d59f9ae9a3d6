"""A hot standby takes a job over, and a frozen leader that wakes up commits nothing.

One checkpoint, a driver after another, the rate source producing throughout:
1. leader A runs; standby B (`dstream run --standby`) starts and waits, following the
   checkpoint. A's whole process group is frozen (SIGSTOP): it keeps its kernel lock but stops
   renewing its lease, so B takes over once the lease has expired. A is thawed (SIGCONT): it
   finds the newer epoch and exits 6 naming it, having committed nothing after the takeover.
2. STANDBY_ROUNDS times (1 in `make test`): a standby waits and the leader's process group is
   killed (SIGKILL): the kernel frees the leader's lock and the standby takes over within a
   poll; then that leader is killed too and a plain `dstream run` is started right after (a
   restart without standby, as a supervisor would do it).
3. The last driver commits a batch it planned itself and is stopped gracefully; every committed
   batch is then compared with the reference computed from the input offsets (harness.verify).
Each takeover is timed from the fault to the new leader's first committed batch, beside the
phases of its recovery timeline (runtime/timeline.py); a `takeover:` line sums them up:

    takeover: rounds=N standby_p50=Xs standby_max=Ys restart_p50=Xs restart_max=Ys frozen=Zs
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from conditions import eventually
from dstream import StreamingContext
from dstream.runtime.checkpoint.directory import CheckpointDir
from dstream.runtime.leadership.shadow import Shadow
from fault.harness import (
    InProcessJob,
    RateJob,
    fault_rng,
    fault_seed,
    truncate_at_random_byte,
    verify,
)
from fault.test_fault_checkpoint import assert_exact
from running_driver import Driver
from servers import free_port

LEASE_S = 5
ROUNDS = int(os.environ.get("STANDBY_ROUNDS", "1"))
STEP_TIMEOUT_S = 240
LEASE_CONF = ("--conf", f"spark.dstream.lease.durationSeconds={LEASE_S}")
TIMELINE = re.compile(r"recovery timeline: phase=(\w+) at=([\d.]+)")
SHADOWED = "standby: taking over with the state it shadowed"


def is_batch(text: str) -> bool:
    return text.startswith("batch ") and "FAILED" not in text


def warm(text: str) -> bool:
    return "standby: warm, following" in text


def commits_by_epoch(job: RateJob) -> dict[int, int]:
    """Every commit marker in the log: batch time -> the epoch it was written under."""
    found = {}
    for path in (job.checkpoint / "log").glob("commit-*.json"):
        body = json.loads(path.read_text())["body"]
        found[body["time"]] = body.get("epoch", 0)
    return found


def start(job: RateJob, *args: str, launcher: tuple[str, ...] = ()) -> Driver:
    log = job.root / "drivers.log"
    return Driver(job.manifest, *LEASE_CONF, *args, log=log, launcher=launcher).start()


def monotonic_of(wall: float) -> float:
    """A wall-clock instant on the monotonic clock the drivers' lines are stamped with."""
    return time.monotonic() - (time.time() - wall)


@dataclass
class Takeovers:
    """Seconds from each fault to the new leader's first committed batch, and a line per
    takeover with its timeline."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)

    def timed(self, kind: str, driver: Driver, fault_at: float) -> None:
        first = driver.wait_for_line(is_batch, STEP_TIMEOUT_S)
        took = first.at - monotonic_of(fault_at)
        self.seconds.setdefault(kind, []).append(took)
        phases = [
            f"{m.group(1)}=+{float(m.group(2)) - fault_at:.1f}s"
            for line in driver.lines
            if (m := TIMELINE.search(line.text)) and float(m.group(2)) >= fault_at
        ]
        shadowed = any(SHADOWED in line.text for line in driver.lines)
        self.lines.append(
            f"{kind}: first batch +{took:.1f}s{' from its shadow' if shadowed else ''} "
            f"({', '.join(phases)})"
        )

    def summary(self) -> str:
        figures = " ".join(
            f"{kind}_p50={statistics.median(values):.1f}s {kind}_max={max(values):.1f}s"
            for kind, values in self.seconds.items()
        )
        return f"takeover: rounds={ROUNDS} {figures}"


@pytest.mark.slow
@pytest.mark.timeout(900 + 300 * ROUNDS)
def test_standby_takes_over_a_frozen_then_a_killed_leader_output_exact(tmp_path):
    seed = fault_seed()
    job = RateJob(tmp_path, batch_s=2, window_s=10, checkpoint_interval_s=4, seed=seed % 1000)
    job.write()
    takeovers = Takeovers()
    drivers = [start(job)]
    try:
        drivers[0].wait_for_line(is_batch, STEP_TIMEOUT_S)
        drivers.append(standby_of(job))
        split_brain(job, *drivers, takeovers)
        for _ in range(ROUNDS):
            drivers.append(standby_of(job))
            killed_at = kill(drivers[-2])
            takeovers.timed("standby", drivers[-1], killed_at)
            settle(drivers[-1])
            killed_at = kill(drivers[-1])
            drivers.append(start(job))
            takeovers.timed("restart", drivers[-1], killed_at)
        settle(drivers[-1])
        assert drivers[-1].terminate(timeout_s=120) == 0
    finally:
        for driver in drivers:
            signal_group(driver, signal.SIGCONT)
            driver.kill()
    verdict = verify(job)
    print("\n" + "\n".join(takeovers.lines))
    print(takeovers.summary())
    print(f"batches={verdict.batches} lost={verdict.lost} duplicated={verdict.duplicated}")
    assert max(commits_by_epoch(job).values()) == 2 + 2 * ROUNDS  # every takeover claimed one
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_leader_stopped_mid_batch_hands_the_lead_to_its_standby_at_once(tmp_path):
    """SIGTERM, as a pod's deletion sends it, to the leader of a job with `driver.standby`
    just after a batch started (its outputs sleep 6 s): the standby takes the lead while that
    batch still runs, so the standby commits it under the next epoch (the old leader's commit
    is refused, or its batch fails first as its context stops: seen in CI). Without the
    hand-over the old leader would commit it, holding the lead until then (or, past a pod's
    grace period, until its lease expired)."""
    job = RateJob(
        tmp_path,
        batch_s=2,
        window_s=10,
        checkpoint_interval_s=4,
        output_sleep_s=6,
        extra_spec={"driver": {"standby": True}},
    )
    job.write()
    leader = start(job)
    drivers = [leader]
    try:
        leader.wait_for_line(is_batch, STEP_TIMEOUT_S)
        drivers.append(standby_of(job))
        logged = batch_records(job)
        started = eventually(lambda: batch_records(job) - logged, STEP_TIMEOUT_S)
        assert leader.terminate(timeout_s=STEP_TIMEOUT_S) == 0
        eventually(lambda: started <= commits_by_epoch(job).keys(), STEP_TIMEOUT_S)
        epochs = commits_by_epoch(job)
        assert {epochs[t] for t in started} == {2}, (started, epochs)
        settle(drivers[1])
        assert drivers[1].terminate(timeout_s=120) == 0
    finally:
        for driver in drivers:
            driver.kill()
    verdict = verify(job)
    assert not verdict.mismatched_batches, verdict.mismatched_batches
    assert verdict.lost == 0 and verdict.duplicated == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_standby_told_to_stop_ends_at_once_as_a_pods_main_process_too(tmp_path):
    """SIGTERM, from outside, to a standby that is PID 1 of its own PID namespace, as a
    driver pod's main process is: it ends at once, exit 0, saying why. The kernel does not
    apply a signal's default action to such a process, so without a handler of its own a
    deleted standby pod ran on for its whole grace period, and could take the lead meanwhile.
    The leader goes on committing."""
    job = RateJob(tmp_path, batch_s=2, window_s=10, checkpoint_interval_s=4)
    job.write()
    drivers = [start(job)]
    try:
        drivers[0].wait_for_line(is_batch, STEP_TIMEOUT_S)
        drivers.append(standby_of(job, launcher=OWN_PID_NAMESPACE))
        os.kill(namespace_init(drivers[1].pid), signal.SIGTERM)
        assert drivers[1].wait(STEP_TIMEOUT_S) == 0
        assert "SIGTERM received while standing by" in drivers[1].output()
        settle(drivers[0])
    finally:
        for driver in drivers:
            driver.kill()


OWN_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--kill-child")


def namespace_init(launcher_pid: int) -> int:
    """The process `unshare --fork` started: PID 1 of its namespace, by its PID out here."""
    children = Path(f"/proc/{launcher_pid}/task/{launcher_pid}/children")
    return int(eventually(lambda: children.read_text().split(), STEP_TIMEOUT_S)[0])


def batch_records(job: RateJob) -> set[int]:
    """The batch times the log has a record of (a batch's record is written as it starts)."""
    return {
        int(path.stem.removeprefix("batch-"))
        for path in (job.checkpoint / "log").glob("batch-*.json")
    }


def standby_of(job: RateJob, launcher: tuple[str, ...] = ()) -> Driver:
    """A standby, once it is warm (its workers up, the checkpoint read once); its API says it
    is a standby, without an epoch."""
    port = free_port()
    standby = start(job, "--standby", "--port", str(port), launcher=launcher)
    standby.wait_for_line(warm, STEP_TIMEOUT_S)
    status = eventually(lambda: status_of(port), 60)
    assert (status["state"], status["epoch"]) == ("standby", None), status
    return standby


def status_of(port: int) -> dict | None:
    """A driver's /v1/status, or None while its API does not answer yet."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/status", timeout=60).json()
    except httpx.TransportError:
        return None


def settle(driver: Driver) -> None:
    """Wait until the driver commits another batch."""
    driver.wait_for_line(is_batch, STEP_TIMEOUT_S, after=len(driver.lines))


def kill(driver: Driver) -> float:
    """SIGKILL the driver's process group; when (wall clock)."""
    killed_at = time.time()
    driver.kill()
    return killed_at


def split_brain(job: RateJob, leader: Driver, standby: Driver, takeovers: Takeovers) -> None:
    """Freeze the leader until the standby leads and commits; thawed, the old leader must exit
    6 naming epoch 2, without a commit of its epoch after the freeze."""
    settle(leader)
    signal_group(leader, signal.SIGSTOP)
    frozen_at = time.time()
    before = commits_by_epoch(job)
    takeovers.timed("frozen", standby, frozen_at)
    settle(standby)
    thawed_from = len(leader.lines)
    signal_group(leader, signal.SIGCONT)
    assert leader.wait(STEP_TIMEOUT_S) == 6
    after_thaw = [line.text for line in leader.lines[thawed_from:]]
    assert any("deposed: epoch 2 was claimed" in text for text in after_thaw), after_thaw
    late = {t: e for t, e in commits_by_epoch(job).items() if e < 2 and t not in before}
    assert not late, f"commits of the deposed epoch after the takeover: {late}"


def signal_group(driver: Driver, sig: int) -> None:
    try:
        os.killpg(driver.pid, sig)
    except ProcessLookupError:
        pass


# -- the standby's shadow of its leader, in this process ------------------------------------


@pytest.fixture
def job(sc, tmp_path) -> InProcessJob:
    """test_fault_checkpoint's job: 1 s batches, a 5 s incremental window (durable batches),
    state checkpoints every 2 s, on the session's SparkContext and a manual clock."""
    return InProcessJob(
        sc, RateJob(tmp_path, batch_s=1, partitions=1, window_s=5, checkpoint_interval_s=2)
    )


class InProcessStandby:
    """A standby StreamingContext of the job on the same SparkContext, started in a thread (a
    standby's start returns only once it leads)."""

    def __init__(self, job: InProcessJob):
        self._job = job
        self.ssc = job.context()
        self._thread = threading.Thread(target=self.ssc.start, kwargs={"standby": True})
        self._thread.start()

    @property
    def shadow(self) -> Shadow:
        def started() -> Shadow | None:
            scheduler = self.ssc.scheduler
            leadership = scheduler.leadership if scheduler is not None else None
            return leadership.shadow if leadership is not None else None

        return eventually(started, STEP_TIMEOUT_S)

    def wait_until_shadowed(self, time_ms: int) -> None:
        shadow = self.shadow
        eventually(lambda: shadow.failure or (shadow.stepped_ms or 0) >= time_ms, STEP_TIMEOUT_S)
        assert shadow.failure is None, shadow.failure

    def leads(self) -> StreamingContext:
        self._thread.join(STEP_TIMEOUT_S)
        assert not self._thread.is_alive(), "the standby did not take the lead"
        clock = self.ssc._clock  # to the job's time, which the leader's clock brought on
        clock.advance(self._job.now_ms - clock.now_ms())
        return self.ssc


def test_a_standby_takes_over_from_the_state_it_shadowed_output_exact(job, caplog):
    """The standby computes each batch the leader commits (its state checkpoints read where
    the leader wrote them, no file of its own written); when the leader stops it leads from
    that state, without restoring it from the checkpoint, and the output stays exact."""
    caplog.set_level(logging.INFO, logger="dstream")
    leader = job.start()
    job.run(leader, 2)
    standby = InProcessStandby(job)
    standby.wait_until_shadowed(job.now_ms)
    job.run(leader, 5)  # state checkpoints at 4 and 6 s
    standby.wait_until_shadowed(job.now_ms)
    leader.stop(stopSparkContext=False)
    ssc = standby.leads()
    assert standby.shadow.stepped_ms == job.now_ms
    assert SHADOWED in caplog.text
    assert ssc._scheduler.recovery.restored_state  # what the shadow restored at its start
    job.run(ssc, 4)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def test_a_standby_whose_shadow_failed_restores_state_from_the_checkpoint(job, caplog):
    """The newest state checkpoint torn before the standby starts: its shadow cannot restore
    the leader's state and gives up; the takeover restores from the checkpoint as without a
    shadow (the torn checkpoint skipped, the previous one serves), and the output stays
    exact."""
    caplog.set_level(logging.INFO, logger="dstream")
    leader = job.start()
    job.run(leader, 6)  # state checkpoints at 2, 4 and 6 s
    found = CheckpointDir(job.job.checkpoint).load_log().state_checkpoints()
    state = next(s for s in leader._graph.streams if type(s).__name__ == "StateDStream")
    torn_time, torn_path = found[str(state._index)][0]
    assert torn_time == job.now_ms
    truncate_at_random_byte(Path(torn_path.removeprefix("file:")) / "part-00000", fault_rng())
    standby = InProcessStandby(job)
    eventually(lambda: standby.shadow.failure, STEP_TIMEOUT_S)
    leader.stop(stopSparkContext=False)
    ssc = standby.leads()
    assert "taking over without the shadowed state" in caplog.text
    assert ssc._scheduler.recovery.torn_files == [torn_path]
    job.run(ssc, 3)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def test_a_standby_whose_shadow_fell_behind_restores_state_from_the_checkpoint(
    job, caplog, monkeypatch
):
    """The shadow holds still (its rounds skipped, as a standby too slow to keep up would
    leave it) while the leader runs on until its log no longer lists a checkpoint the shadow
    keeps in force: the leader pruned what the shadowed state may still need. The takeover
    drops the shadow, says why, restores state from the checkpoint as without a shadow, and
    the output stays exact."""
    caplog.set_level(logging.INFO, logger="dstream")
    leader = job.start()
    job.run(leader, 2)
    standby = InProcessStandby(job)
    standby.wait_until_shadowed(job.now_ms)
    shadow = standby.shadow
    eventually(hold_still(shadow, monkeypatch).is_set, STEP_TIMEOUT_S)
    shadowed_ms = shadow.stepped_ms
    kept = [p for s in standby.ssc._graph.streams for _t, p in s.checkpoint_data.in_force]
    run_until_pruned(job, leader, kept)
    leader.stop(stopSparkContext=False)
    gone = next(path for path in kept if path not in checkpoints_listed(job))
    ssc = standby.leads()
    assert shadow.stepped_ms == shadowed_ms  # it computed nothing while held
    assert (
        f"taking over without the shadowed state (it fell behind: {gone} is no longer in the "
        "log)" in caplog.text
    )
    assert SHADOWED not in caplog.text
    restored = ssc._scheduler.recovery.restored_state
    assert restored and min(restored.values()) > shadowed_ms, restored  # from the checkpoint
    job.run(ssc, 3)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)


def hold_still(shadow: Shadow, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Make the follower's rounds skip the shadow's work from now on; set once a round has
    been skipped (so no round that started before is still computing)."""
    skipped = threading.Event()

    def skip(stop: threading.Event) -> int:
        skipped.set()
        return 0

    monkeypatch.setattr(shadow, "catch_up", skip)
    return skipped


def checkpoints_listed(job: InProcessJob) -> set[str]:
    """Every state checkpoint the commits in the job's log still list."""
    found = CheckpointDir(job.job.checkpoint).load_log(tidy=False).state_checkpoints()
    return {path for kept in found.values() for _time, path in kept}


def run_until_pruned(job: InProcessJob, leader: StreamingContext, kept: list[str]) -> None:
    """Run the leader batch by batch until its log no longer lists one of `kept`; a leader
    that never prunes it within 30 batches fails the test."""
    for _ in range(30):
        job.run(leader, 1)
        if not set(kept) <= checkpoints_listed(job):
            return
    raise AssertionError(f"the leader still lists all of {kept} after 30 batches")


def test_a_standby_is_warm_only_once_its_shadow_holds_the_leaders_newest_commit(
    job, caplog, monkeypatch
):
    """The leader commits another batch while the shadow restores its state (as on a loaded
    machine, where that start took 3 minutes): the standby must not say it is warm before its
    shadow has computed that batch too."""
    caplog.set_level(logging.INFO, logger="dstream")
    leader = job.start()
    job.run(leader, 2)  # a state checkpoint at 2 s: the shadow's start restores it
    started = threading.Event()

    def start_then_lead_on(self: Shadow, found: Any) -> bool:
        if not real_start(self, found):
            return False
        if not started.is_set():
            started.set()
            job.run(leader, 1)
        return True

    real_start = Shadow._start
    monkeypatch.setattr(Shadow, "_start", start_then_lead_on)
    standby = InProcessStandby(job)
    shadow = standby.shadow
    eventually(lambda: warm(caplog.text), STEP_TIMEOUT_S)
    assert started.is_set()
    assert shadow.failure is None, shadow.failure
    assert shadow.stepped_ms == job.now_ms  # the batch committed during its start, too
    leader.stop(stopSparkContext=False)
    ssc = standby.leads()
    job.run(ssc, 2)
    ssc.stop(stopSparkContext=False)
    assert_exact(job)
