"""A driver started as a standby (`dstream run --standby`, both driver pods of a
`driver.standby` job) that finds its checkpoint's lead free takes it at once: it does not first
warm up and follow the checkpoint as a waiting standby does, which would only delay its first
batch and share its executors with the warm-up's jobs. When it recovers, as any driver that did
not stand by, it warms up beside the recovery."""

from __future__ import annotations

import threading

from dstream import StreamingContext
from dstream.runtime.clock import ManualClock
from dstream.runtime.recovery import WARM_UP_JOB_GROUP

BATCH_TIMEOUT_S = 120


def test_a_standby_that_finds_the_lead_free_leads_at_once_without_following(sc, tmp_path):
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    ssc.rateStream(10, 1, seed=3).count().foreachRDD(lambda rdd: None)
    ssc._clock = ManualClock(0)
    ssc.start(standby=True)
    try:
        scheduler = ssc._scheduler
        assert (scheduler.state, scheduler.fence.epoch) == ("running", 1)
        following = [t.name for t in threading.enumerate() if t.name == "dstream-standby"]
        assert not following, "the leader started the standby's follower"
        ssc._clock.advance(1000)
        scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)


def run_rate_job(sc, checkpoint: str, standby: bool = False) -> StreamingContext:
    """The rate job of this module on `checkpoint`, started (recovering, if it exists)."""
    ssc = StreamingContext(sc, 1)
    ssc.checkpoint(checkpoint)
    ssc.rateStream(10, 1, seed=3).count().foreachRDD(lambda rdd: None)
    ssc._clock = ManualClock(0)
    ssc.start(standby=standby)
    return ssc


def warm_up_jobs(sc) -> dict[int, str]:
    """The warm-up's Spark jobs of this session (the SparkContext is shared) and their statuses,
    once its thread has ended."""
    for thread in threading.enumerate():
        if thread.name == "dstream-warm-up":
            thread.join(BATCH_TIMEOUT_S)
    tracker = sc.statusTracker()
    return {j: tracker.getJobInfo(j).status for j in tracker.getJobIdsForGroup(WARM_UP_JOB_GROUP)}


def test_a_restarted_driver_warms_its_workers_up_beside_the_recovery(sc, tmp_path):
    """A fresh start has nothing to warm up for; a restart runs the batch it left open, and the
    warm-up (recovery.warm_up_beside_recovery) starts its Python workers meanwhile."""
    checkpoint = str(tmp_path / "checkpoint")
    before = warm_up_jobs(sc)
    ssc = run_rate_job(sc, checkpoint)
    try:
        ssc._clock.advance(1000)
        ssc._scheduler.wait_for_batch(1000, BATCH_TIMEOUT_S)
    finally:
        ssc.stop(stopSparkContext=False)
    assert warm_up_jobs(sc) == before
    restarted = run_rate_job(sc, checkpoint, standby=True)  # a pod's driver: the lead is free
    try:
        assert restarted._scheduler.recovery is not None
        jobs = {j: status for j, status in warm_up_jobs(sc).items() if j not in before}
        assert jobs and set(jobs.values()) == {"SUCCEEDED"}, jobs
        restarted._clock.advance(2000)
        restarted._scheduler.wait_for_batch(2000, BATCH_TIMEOUT_S)
    finally:
        restarted.stop(stopSparkContext=False)
