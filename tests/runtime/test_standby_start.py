"""A driver started as a standby (`dstream run --standby`, both driver pods of a
`driver.standby` job) that finds its checkpoint's lead free takes it at once: it does not first
warm up and follow the checkpoint as a waiting standby does, which would only delay its first
batch and share its executors with the warm-up's jobs."""

from __future__ import annotations

import threading

from dstream import StreamingContext
from dstream.runtime.scheduling.clock import ManualClock

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
