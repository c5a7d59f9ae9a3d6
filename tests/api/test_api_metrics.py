"""The driver's Prometheus metrics, fed by a real StreamingContext on a manual clock."""

from __future__ import annotations

import pytest
from conditions import eventually
from dstream.runtime.checkpoint.recovery import RECOVERY_KINDS
from dstream.runtime.control.backpressure import PIDRateEstimator, RateController
from dstream.runtime.scheduling.batch import BatchEvent, BatchInfo
from dstream.service.metrics import StreamingMetrics
from streams import manual_context, run_batches

JOB = "metricsjob"


def value(metrics: StreamingMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"job": JOB, **labels})


@pytest.fixture
def ssc(sc):
    return manual_context(sc)


def completed(
    time_ms: int, records: int, error: str | None = None, coalesced: tuple[int, ...] = ()
) -> BatchEvent:
    info = BatchInfo(
        time_ms, time_ms + 100, {"rate": records}, {"rate": 1000.0}, coalesced=list(coalesced)
    )
    info.processing_start_ms = time_ms + 600  # waited 500 ms
    info.processing_end_ms = time_ms + 2600  # ran 2 s
    info.checkpoint_seconds = 0.02
    info.error = error
    return BatchEvent(info)


def test_retried_and_skipped_batches_are_counted(ssc):
    ssc.rateStream(1000, name="rate").foreachRDD(lambda rdd: None)
    metrics = StreamingMetrics(JOB, ssc, state_keys_interval_s=3600)
    assert value(metrics, "dstream_batch_retries_total") == 0
    assert value(metrics, "dstream_skipped_batches_total") == 0
    retried = completed(1000, 10)
    retried.batchInfo().retries = 2
    skipped = completed(2000, 10, error="OSError: sink down")
    skipped.batchInfo().retries, skipped.batchInfo().skipped = 5, True
    for event in (retried, skipped):
        metrics.onBatchCompleted(event)
    assert value(metrics, "dstream_batch_retries_total") == 7
    assert value(metrics, "dstream_skipped_batches_total") == 1
    assert value(metrics, "dstream_failed_batches_total") == 1


def test_completed_batches_update_counters_histograms_and_gauges(ssc):
    source = ssc.rateStream(1000, name="rate")
    source.foreachRDD(lambda rdd: None)
    metrics = StreamingMetrics(JOB, ssc, state_keys_interval_s=3600)
    assert value(metrics, "dstream_input_records_total", source="rate") == 0
    assert value(metrics, "dstream_failed_batches_total") == 0
    assert value(metrics, "dstream_coalesced_batches_total") == 0
    metrics.onBatchCompleted(completed(1000, 700))
    metrics.onBatchCompleted(completed(4000, 300, error="ValueError: boom", coalesced=(2000, 3000)))
    assert value(metrics, "dstream_coalesced_batches_total") == 2
    assert value(metrics, "dstream_batches_completed_total") == 2
    assert value(metrics, "dstream_failed_batches_total") == 1
    assert value(metrics, "dstream_input_records_total", source="rate") == 1000
    assert value(metrics, "dstream_batch_processing_seconds_count") == 2
    assert value(metrics, "dstream_batch_processing_seconds_bucket", le="2.0") == 2
    assert value(metrics, "dstream_batch_processing_seconds_bucket", le="1.0") == 0
    assert value(metrics, "dstream_last_batch_processing_seconds") == 2.0
    assert value(metrics, "dstream_last_batch_scheduling_delay_seconds") == 0.5
    assert value(metrics, "dstream_last_batch_total_delay_seconds") == 2.5
    assert value(metrics, "dstream_last_completed_batch_timestamp_seconds") == 4.0
    assert value(metrics, "dstream_checkpoint_seconds_sum") == pytest.approx(0.04)
    assert value(metrics, "dstream_batch_interval_seconds") == 1.0


def test_scrape_reads_rate_limit_pid_terms_backlog_and_recoveries(ssc, monkeypatch):
    source = ssc.rateStream(5000, name="rate")
    source.foreachRDD(lambda rdd: rdd.count())
    controller = RateController(PIDRateEstimator(1000), initial_rate=2000)
    monkeypatch.setattr(ssc, "_rate_controllers", lambda: {"rate": controller})
    metrics = StreamingMetrics(JOB, ssc, state_keys_interval_s=3600)
    assert value(metrics, "dstream_pending_batches") is None  # not started: nothing to read
    run_batches(ssc, 2)
    assert value(metrics, "dstream_rate_limit_records_per_second", source="rate") == 2000
    assert value(metrics, "dstream_pid_error", source="rate") is None  # no estimate yet
    assert value(metrics, "dstream_backlog_records", source="rate") == 2 * 5000 - 2 * 2000
    assert value(metrics, "dstream_pending_batches") == 0
    for kind in RECOVERY_KINDS:
        assert value(metrics, "dstream_recoveries_total", kind=kind) == 0
    controller.update(10_000, 1000, 1000, 0, limited=True)
    controller.update(11_000, 1500, 1000, 500, limited=True)
    assert value(metrics, "dstream_pid_error", source="rate") == pytest.approx(-500)
    assert value(metrics, "dstream_pid_historical_error", source="rate") == pytest.approx(750)
    assert value(metrics, "dstream_pid_derivative_error", source="rate") == pytest.approx(-500)
    assert value(metrics, "dstream_rate_limit_records_per_second", source="rate") == 1350


def test_state_keys_are_sampled_from_the_newest_rdd_of_query_streams(ssc, tmp_path):
    words = ssc.queueStream([[("a", 1), ("b", 1)], [("c", 1)], [("a", 1)]])
    state = words.updateStateByKey(lambda new, old: sum(new) + (old or 0))
    ssc.checkpoint(str(tmp_path / "checkpoint"))
    ssc.registerQueryStream("totals", state)
    state.foreachRDD(lambda rdd: rdd.count())
    metrics = StreamingMetrics(JOB, ssc, state_keys_interval_s=0)
    ssc.addStreamingListener(metrics)
    run_batches(ssc, 3)
    eventually(
        lambda: value(metrics, "dstream_state_keys", stream="totals") == 3,
        60,
        interval=0.1,
        message=lambda: f"3 state keys (counted: {metrics.state_keys.counts})",
    )
    metrics.close()


def test_recoveries_count_what_a_restart_found(sc, tmp_path):
    def build() -> StreamingMetrics:
        ssc = manual_context(sc)
        ssc.checkpoint(str(tmp_path / "checkpoint"))
        ssc.rateStream(100, name="rate").foreachRDD(lambda rdd: rdd.count())
        return StreamingMetrics(JOB, ssc, state_keys_interval_s=3600)

    first = build()
    run_batches(first._ssc, 2)
    assert value(first, "dstream_recoveries_total", kind="driver_restart") == 0
    restarted = build()
    restarted._ssc.start()
    restarted._ssc.stop(stopSparkContext=False)
    assert value(restarted, "dstream_recoveries_total", kind="driver_restart") == 1
    assert value(restarted, "dstream_recoveries_total", kind="torn_files") == 0
