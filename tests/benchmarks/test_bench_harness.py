"""The benchmark harness's own logic: verdicts, percentiles, the rate search's bracketing, the
output checker against the independent reference, and the load gate. Pure logic, except the
trials that run a tiny real job through each system (`solo`: they read batch delays)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.common import RECORD_BYTES, SEED, textgen
from bench.machine import LoadSample, busy_reason
from bench.throughput import feed, reference
from bench.throughput.reference import check_outputs, count_digest, expected, sample_batches, top_k
from bench.throughput.search import RateSearch, round_rate
from bench.throughput.trial import BUSY, OK, SLOW, WRONG, Verdict, judge, percentile

ROOT = Path(__file__).parents[2]


def test_percentile_is_nearest_rank():
    values = list(range(1, 31))  # 1..30
    assert percentile(values, 0.9) == 27
    assert percentile(values, 0.5) == 15
    assert percentile([5.0], 0.99) == 5.0
    assert percentile(list(range(1, 11)), 0.9) == 9  # not the maximum of 10 batches


def test_judge_fails_wrong_output_even_when_fast():
    verdict = judge([100.0] * 30, [0.0] * 30, 30, False, "batch 3: no output")
    assert verdict.kind == WRONG and not verdict.sustainable
    assert "batch 3" in verdict.reason
    nothing = judge([], [], 30, False, "no batch completed")
    assert nothing.kind == SLOW  # no batch at all: too slow, not wrong


def test_judge_speed_rules():
    ok = judge([500.0] * 30, [10.0] * 30, 30, True, "ok")
    assert ok.kind == OK and ok.sustainable
    missing = judge([500.0] * 20, [10.0] * 20, 30, True, "ok")
    assert missing.kind == SLOW and "20/30" in missing.reason
    slow_tail = judge([500.0] * 26 + [1200.0] * 4, [10.0] * 30, 30, True, "ok")
    assert slow_tail.kind == SLOW and "p90" in slow_tail.reason
    growing = judge([900.0] * 30, [float(20 * i) for i in range(30)], 30, True, "ok")
    assert growing.kind == SLOW and "grew" in growing.reason


def _verdict(rate: int, capacity: int, kind_at: dict[int, str] | None = None) -> Verdict:
    """A fake system: processing = 200 ms + rate / capacity * 800 ms, sustainable below 1 s."""
    processing = 200 + 800 * rate / capacity
    kind = (kind_at or {}).get(rate) or (OK if processing < 1000 else SLOW)
    return Verdict(kind, kind, processing, processing, 0.0, 30)


def _drive(search: RateSearch, capacity: int, kinds: dict[int, str] | None = None, limit=50):
    for _ in range(limit):
        planned = search.next_trial()
        if planned is None:
            return search.result
        rate, confirmation = planned
        search.record(rate, confirmation, _verdict(rate, capacity, kinds))
    raise AssertionError("the search did not end")


def test_search_brackets_and_confirms_below_capacity():
    result = _drive(RateSearch(50_000, max_trials=6, tolerance=0.1, confirm=True), 300_000)
    assert result.status == "confirmed"
    assert 0.9 * 300_000 <= result.rate < 300_000  # close to the edge, never above it
    assert result.trials[-1].confirmation and result.trials[-1].rate == result.rate
    passed = [t.rate for t in result.trials if t.verdict.sustainable and not t.confirmation]
    assert max(passed) == result.rate
    low, high = RateSearch.bracket(_search_of(result))
    assert low == result.rate and high is not None and high / low <= 1.1  # bracketed


def _search_of(result):
    search = RateSearch(0, 0, 0.1, True)
    search.trials = result.trials
    return search


def test_after_two_failed_trials_the_search_bisects_instead_of_trusting_the_line():
    """Run 7 of 2026-11-26 (Grep, 500 ms): past 800,000 the p90s did not grow with the rate,
    the line placed the edge just under each failure, and the search used its trials up at
    1,900,000-2,300,000 and confirmed 800,000."""
    search = RateSearch(200_000, max_trials=6, tolerance=0.1, confirm=True, interval_ms=500)
    for rate, p90, kind in [
        (200_000, 161.0, OK),
        (800_000, 252.0, OK),
        (2_300_000, 516.0, SLOW),
        (2_100_000, 494.0, SLOW),
    ]:
        search.record(rate, False, Verdict(kind, kind, p90, p90, 0.0, 30))
    rate, confirmation = search.next_trial()
    assert not confirmation
    assert 1_200_000 <= rate <= 1_400_000  # the bracket's geometric middle, about 1,296,000


def test_search_reports_no_figure_when_nothing_passes():
    result = _drive(RateSearch(50_000, max_trials=6, tolerance=0.1, confirm=True), 50)
    assert result.status == "no passing rate" and result.rate is None


def test_failed_confirmation_steps_down_and_never_falls_back():
    capacity = 300_000
    search = RateSearch(50_000, max_trials=6, tolerance=0.1, confirm=True)
    # Every confirmation fails (as a longer trial with the window full might): no figure.
    for _ in range(60):
        planned = search.next_trial()
        if planned is None:
            break
        rate, confirmation = planned
        verdict = _verdict(rate, capacity)
        if confirmation:
            verdict = judge([1500.0] * 45, [0.0] * 45, 45, True, "x")
        search.record(rate, confirmation, verdict)
    assert search.result.status == "no passing rate" and search.result.rate is None
    confirmations = [t.rate for t in search.trials if t.confirmation]
    assert len(confirmations) == 3 and confirmations == sorted(confirmations, reverse=True)


def test_a_failed_confirmation_steps_down_from_its_own_rate():
    """Not all the way to the next passing search rate (a near miss at 200,000 must not
    report 50,000), and not below it either."""
    search = RateSearch(50_000, max_trials=6, tolerance=0.1, confirm=True)
    fast, slow = (
        judge([500.0] * 30, [0.0] * 30, 30, True, "ok"),
        judge([1200.0] * 30, [0.0] * 30, 30, True, "ok"),
    )
    for rate, confirmation, verdict in [
        (50_000, False, fast),
        (200_000, False, fast),
        (210_000, False, slow),
        (200_000, True, slow),
    ]:
        search.record(rate, confirmation, verdict)
    assert search.next_trial() == (170_000, True)
    search.record(170_000, True, slow)
    assert search.next_trial() == (140_000, True)


def test_wrong_output_and_busy_machine_end_the_search_without_a_figure():
    wrong = _drive(RateSearch(50_000, 6, 0.1, True), 300_000, {50_000: WRONG})
    assert (wrong.status, wrong.rate) == ("wrong output", None)
    busy = _drive(RateSearch(50_000, 6, 0.1, True), 300_000, {50_000: BUSY})
    assert (busy.status, busy.rate) == ("machine busy", None)


def test_search_without_confirmation_says_so():
    result = _drive(RateSearch(50_000, 3, 0.3, confirm=False), 300_000)
    assert result.status == "passed search" and not any(t.confirmation for t in result.trials)


def test_round_rate_two_significant_digits():
    assert round_rate(123_456) == 120_000 and round_rate(3) == 100


def _digest_of(lines: list[str], workload: str):
    words = Counter(w for line in lines for w in line.split())
    if workload == "grep":
        return sum("bab" in line for line in lines)
    return count_digest(words) if workload == "wordcount" else top_k(words)


def test_reference_matches_a_direct_count_of_the_same_lines():
    """The reference's windowing over batches agrees with counting the lines directly."""
    rate, partitions = 300, 2
    lines_of = {
        k: [
            line
            for p, start, end in feed.batch_slices(rate, partitions, k)
            for line in textgen.lines(SEED, RECORD_BYTES, p, start, end)
        ]
        for k in range(1, 33)
    }
    assert sum(len(v) for v in lines_of.values()) == rate * 32
    assert expected("grep", rate, partitions, 5, False) == _digest_of(lines_of[5], "grep") > 0
    window = [line for k in range(3, 33) for line in lines_of[k]]  # batch 32's 30 batches
    for workload in ("wordcount", "topk"):
        assert expected(workload, rate, partitions, 32, False) == _digest_of(window, workload)


def test_checker_catches_wrong_missing_and_empty_outputs():
    rate, partitions = 200, 2
    truth = {k: expected("wordcount", rate, partitions, k, False) for k in range(1, 8)}
    assert check_outputs("wordcount", rate, partitions, truth, list(range(3, 8)), 3).ok
    off_by_one = {**truth, 7: [truth[7][0], truth[7][1] + 1, truth[7][2]]}
    bad = check_outputs("wordcount", rate, partitions, off_by_one, list(range(3, 8)), 3)
    assert not bad.ok and "batch 7" in bad.reason
    missing = {k: v for k, v in truth.items() if k != 7}
    assert "no output" in check_outputs("wordcount", rate, partitions, missing, [7], 1).reason
    empty = {k: [0, 0, 0] for k in truth}
    assert not check_outputs("wordcount", rate, partitions, empty, [5], 1).ok
    assert not check_outputs("grep", rate, partitions, {}, [], 3).ok  # nothing completed


def test_restricted_reference_keeps_only_the_batch_words():
    full = expected("wordcount", 200, 2, 10, False)
    restricted = expected("wordcount", 200, 2, 10, True)
    assert restricted[0] < full[0] and restricted[1] <= full[1]


def test_sample_batches_spread_and_include_the_last():
    assert sample_batches(list(range(16, 61)), 4) == [16, 31, 45, 60]
    assert sample_batches([3, 4], 4) == [3, 4]
    assert sample_batches([], 4) == []


def _samples(others: list[float]) -> list[LoadSample]:
    return [LoadSample(float(i), 2.0, value) for i, value in enumerate(others)]


def test_load_gate():
    quiet = _samples([0.05] * 60)
    assert busy_reason(quiet, 0.25, 10) is None
    burst = _samples([0.05] * 30 + [1.0] * 12 + [0.05] * 18)
    assert "cores" in busy_reason(burst, 0.25, 10)
    spike = _samples([0.05] * 30 + [1.5] + [0.05] * 29)  # one second: not a busy stretch
    assert busy_reason(spike, 0.25, 10) is None
    short_busy = _samples([0.6] * 5)  # a trial shorter than a stretch counts as a whole
    assert busy_reason(short_busy, 0.25, 10) is not None


# The trials on a real job run solo: a trial measures from the first batch that starts on time,
# which a machine starved by the parallel tests may never let happen. On a slow 2-core machine
# among them, pyspark.streaming's half-second trial ran into the 300 s timeout, its job's lineage
# by then deep enough that a task's deserialization overflowed the stack, which ends a local JVM:
# the worker's shared SparkContext, and with it every later test of that worker.
@pytest.mark.solo
@pytest.mark.parametrize(
    ("system_name", "variant"),
    [("dstream", "tuned"), ("pyspark.streaming", "tuned"), ("structured", "expert")],
)
def test_same_program_passes_the_checker_on_a_real_job(sc, system_name, variant):
    """The shared program text, run by each DStream engine on its input, and Structured
    Streaming's expert formulation output what the independent reference says (a tiny rate:
    this is about correctness, not speed)."""
    from bench.throughput.systems import SYSTEM_CLASSES

    system = SYSTEM_CLASSES[system_name](sc, 2)
    run = system.run("wordcount", variant, 300, 1, 3, timeout_s=300)
    assert len(run.batches) == 3
    check = check_outputs("wordcount", 300, 2, run.outputs, run.intervals, 3)
    assert check.ok, check.reason
    assert run.intervals == sorted(run.intervals) and run.intervals[0] >= 2
    for batch in run.batches:
        # each record of interval k arrived within the second before the batch time and was
        # output at the end of a batch: its own, or (append mode) one that came after it
        waited = batch.end_ms - batch.time_ms
        assert batch.latency_p50_ms is not None and batch.latency_p99_ms is not None
        assert waited <= batch.latency_p50_ms <= batch.latency_p99_ms
        assert batch.latency_p99_ms - batch.latency_p50_ms <= 500
        if system_name == "structured":
            assert batch.latency_p50_ms > waited + 500  # output by a later micro-batch
        else:
            assert batch.latency_p99_ms <= waited + 1000


@pytest.mark.solo  # a trial on a real job, as above
@pytest.mark.parametrize(
    ("system_name", "variant", "workload"),
    [
        ("dstream", "tuned", "grep-jvm"),
        ("pyspark.streaming", "tutorial", "grep-jvm"),
        ("structured", "expert", "grep"),
    ],
)
def test_grep_reads_the_same_lines_made_in_the_jvm_or_in_python_on_every_system(
    sc, system_name, variant, workload
):
    """Grep's two inputs, each the other way round from a system's own: the DStream engines
    given lines made in the JVM, Structured Streaming lines made in Python (mapInArrow); the
    outputs are the reference's, and every batch's latency is measured."""
    from bench.throughput.systems import SYSTEM_CLASSES

    system = SYSTEM_CLASSES[system_name](sc, 2)
    run = system.run(workload, variant, 400, 1, 3, timeout_s=300)
    assert len(run.batches) == 3
    check = check_outputs(workload, 400, 2, run.outputs, run.intervals, 3)
    assert check.ok, check.reason
    assert all(b.latency_p99_ms is not None for b in run.batches)


def _progress(batch_id: int, started_ms: int, took_ms: int) -> dict:
    from datetime import UTC, datetime

    stamp = datetime.fromtimestamp(started_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
    return {
        "batchId": batch_id,
        "timestamp": stamp,
        "numInputRows": 1000,
        "durationMs": {"triggerExecution": took_ms},
    }


def test_structured_latency_runs_to_the_micro_batch_that_output_the_records():
    """Structured Streaming's batches from its query progress: the schedule is set by the most
    punctual micro-batch, and a record's latency ends with the micro-batch that output it
    (append mode: two later), not with the one that read it."""
    from bench.throughput.systems import structured_batches

    origin = 1_700_000_000_000
    progress = [_progress(b, origin + 1000 * b + (300 if b == 3 else 0), 200) for b in range(6)]
    same = structured_batches(progress, 1, 1000, 1000)
    assert [b.time_ms for b in same] == [origin + 1000 * b for b in range(1, 6)]
    assert [b.scheduling_ms for b in same] == [0, 0, 300, 0, 0]
    first = same[0]  # its records arrived over the second before it, output 200 ms after it
    assert 200 + 450 <= first.latency_p50_ms <= 200 + 550
    assert 200 + 980 <= first.latency_p99_ms <= 1200
    later = structured_batches(progress, 1, 1000, 1000, emitted={2: 3, 3: 4})
    assert later[0].latency_p50_ms - first.latency_p50_ms == 2000 + 300  # micro-batch 3's end
    assert later[1].latency_p50_ms - same[1].latency_p50_ms == 2000
    assert later[2].latency_p50_ms is None  # interval 4: not output yet


def test_recovery_runs_at_half_of_the_systems_own_confirmed_maximum():
    from bench.recovery.faults import recovery_subject

    table = {
        "wordcount": {
            "dstream/tutorial": {"status": "confirmed", "rate": 100_000},
            "dstream/tuned": {"status": "confirmed", "rate": 300_000},
            "structured/expert": {"status": "no passing rate", "rate": None},
            "structured/plain": {"status": "confirmed", "rate": 1_000},
        }
    }
    tuned = recovery_subject("dstream", table, "dstream.worker.pydaemon")
    assert (tuned.variant, tuned.rate) == ("tuned", 150_000)
    assert recovery_subject("structured", table, "dstream.worker.pydaemon").variant == "plain"
    assert recovery_subject("pyspark.streaming", table, "dstream.worker.pydaemon") is None


def test_a_fault_runs_on_another_layout_of_its_own_kind_of_master_only(monkeypatch, capsys):
    """`--master` moves an executor fault to another local-cluster layout (its executors'
    cores); a master without executor JVMs to kill is refused, naming the fault's own."""
    from bench.recovery import faults

    masters = []
    monkeypatch.setattr(
        faults,
        "executor_kill",
        lambda subject, kills, every, master, cpu: masters.append(master) or {},
    )
    executor = ["--rate", "1000", "--fault", f"executor, {faults.LOCAL_CLUSTER}"]
    assert faults.main([*executor, "--master", "local-cluster[2,2,1024]"]) == 0
    assert masters == ["local-cluster[2,2,1024]"]
    with pytest.raises(SystemExit):
        faults.main([*executor, "--master", "local[2]"])
    assert f"runs on {faults.LOCAL_CLUSTER}" in capsys.readouterr().err


def test_dstreams_executors_start_as_dstream_run_starts_them_and_the_peers_as_sparks_do():
    """The bench runs each engine as its users get it: dstream's executors compile with C1
    only (`service/job.py`), an option given on the command line after it (the JVM takes the
    last), and refresh their peers every second (`runtime/state_storage.py`) unless the
    command line says otherwise; the peers' with Spark's defaults."""
    from dstream.runtime.state.memory import PEERS_TTL_KEY, SPARK_CONF
    from dstream.service.job import QUICK_JIT

    from bench.common import DAEMONS
    from bench.throughput.systems import system_conf

    master, key = "local-cluster[2,1,1024]", "spark.executor.extraJavaOptions"
    given = "-XX:TieredStopAtLevel=4"
    dstream = dict(system_conf("dstream", master, 2, DAEMONS[0], [f"{key}={given}"]).getAll())
    assert dstream[key] == f"{QUICK_JIT} {given}"
    assert dstream[PEERS_TTL_KEY] == SPARK_CONF[PEERS_TTL_KEY]
    own = dict(system_conf("dstream", master, 2, DAEMONS[0], [f"{PEERS_TTL_KEY}=60000"]).getAll())
    assert own[PEERS_TTL_KEY] == "60000"
    for peer in ("pyspark.streaming", "structured"):
        peer_conf = dict(system_conf(peer, master, 2, DAEMONS[0]).getAll())
        assert key not in peer_conf and PEERS_TTL_KEY not in peer_conf


def test_a_kills_cpu_is_read_per_role_and_the_replacement_jvms_per_thread_group():
    """From the kill to the recovery: the executor JVM first seen after the kill and the
    Python workers under it are the replacement's, the rest the survivor's; what the run's
    processes and the idle time leave of the cores is other processes'."""
    from bench.recovery.cpu import Sample, medians, spent

    driver, survivor, killed, new = 10, 20, 21, 30
    roles = {driver: "driver JVM", survivor: "executor JVM", killed: "executor JVM"}
    roles |= {40: "Python workers", 41: "Python workers", 50: "Python workers"}
    parents = {40: survivor, 41: 40, 50: new}
    before = Sample(
        100.0,
        1000.0,
        {driver: 5.0, survivor: 3.0, killed: 3.0, 40: 1.0, 41: 2.0},
        roles,
        parents,
        {survivor: {"tasks": 1.0}, killed: {"tasks": 1.0}},
    )
    threads = {"C2 compiler": 5.0, "main (start-up)": 2.0, "tasks": 2.0}
    after = Sample(
        110.0,
        1002.0,
        {driver: 7.0, survivor: 4.0, new: 9.0, 40: 1.0, 41: 4.0, 50: 3.0},
        roles | {new: "executor JVM"},
        parents,
        {survivor: {"tasks": 1.5}, new: threads},
    )
    read = spent([before, after], 100.5, 110.2, cores=2)
    assert read.window_s == 10.0
    assert read.cpu_s == {
        "driver JVM": 2.0,
        "idle": 2.0,
        "other processes": 1.0,
        "replacement's Python workers": 3.0,
        "replacement's executor JVM": 9.0,
        "survivor's Python workers": 2.0,
        "survivor's executor JVM": 1.0,
    }
    assert read.replacement_threads_cpu_s == threads
    assert spent([after], 100.0, 110.0) is None  # nothing sampled by the kill
    later = spent([before, after], 100.0, 110.0, cores=4)
    assert later.cpu_s["other processes"] == 21.0
    assert medians([read, later])["cpu_s"]["other processes"] == 11.0


def test_each_kills_cpu_is_read_to_its_recovery_or_else_to_the_next_kill_or_the_end():
    from bench.recovery.cpu import Sample
    from bench.recovery.faults import add_cpu

    samples = [Sample(float(t), float(t), {1: float(t)}, {1: "driver JVM"}) for t in range(40)]
    each = [{"recovered": True, "recovery_s": 5.0}, {"recovered": False}, {"recovered": False}]
    add_cpu(each, [10_000, 20_000, 30_000], [20_000, 30_000, None], samples)
    assert [k["cpu"]["window_s"] for k in each] == [5.0, 10.0, 9.0]
    assert each[0]["cpu"]["cpu_s"]["driver JVM"] == 5.0


def test_the_sampler_reads_a_running_jvms_threads_by_group(tmp_path):
    """A real JVM: its compiler and start-up threads are found by their names and their CPU
    counted, and a process of no known role is set apart."""
    from bench.recovery.cpu import sample, thread_cpu_s

    program = tmp_path / "Busy.java"
    program.write_text(
        "public class Busy { public static void main(String[] a) throws Exception {"
        " long n = 0; for (long i = 0; i < 400_000_000L; i++) { n += i % 7; }"
        " System.out.println(n); System.in.read(); } }"
    )
    jvm = subprocess.Popen(["java", str(program)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert jvm.stdout.readline().strip()  # the loop is done: its code was compiled
        moment, groups = sample(jvm.pid), thread_cpu_s(jvm.pid)
    finally:
        jvm.kill()
        jvm.wait()
    assert moment.role == {jvm.pid: "the run's other processes"}
    assert moment.cpu_s[jvm.pid] >= groups["main (start-up)"] > 0.1
    assert groups.get("C1 compiler", 0) + groups.get("C2 compiler", 0) > 0


def test_repeated_kills_count_a_recovery_not_seen_as_the_longest():
    from bench.recovery.faults import percentiles

    kill = {"baseline_ms": 500, "peak_ms": 3000, "recovered": True, "timeline": []}
    each = [kill | {"recovery_s": float(s)} for s in (1, 2, 3, 4, 5, 6, 7, 8, 9)]
    each.append({"baseline_ms": 500, "peak_ms": 9000, "recovered": False, "recovery_s": None})
    summary = percentiles(each, batch_ms=2000)
    assert (summary["kills"], summary["recovered"]) == (10, 9)
    assert summary["recovery_p50_s"] == 5.0 and summary["recovery_p50_intervals"] == 2.5
    assert summary["recovery_p90_s"] == 9.0
    assert all("timeline" not in k for k in summary["each"])
    one_more_lost = [*each[:8], each[9], each[9]]
    assert percentiles(one_more_lost, batch_ms=1000)["recovery_p90_s"] is None


def test_a_kill_reads_back_on_schedule_before_it_reads_recovered():
    """Both readings hold for good: on schedule from the batch after which every delay is
    within the baseline plus an interval (a batch on time before the spike does not count);
    recovered, within RECOVERED_MS of the baseline."""
    from bench.recovery.faults import percentiles, summarize

    def batch(time_ms: int, delay_ms: int) -> dict:
        return {"time_ms": time_ms, "end_ms": time_ms + delay_ms}

    before = [batch(t, 500) for t in range(1000, 11_000, 1000)]
    fault_ms = 10_200
    delays = [1200, 4000, 3600, 2900, 2200, 1400, 1100, 500]  # due at 11 s, 12 s, ..., in turn
    after = [batch(11_000 + 1000 * n, d) for n, d in enumerate(delays)]
    kill = summarize(before, after, fault_ms, batch_ms=1000)
    assert kill["baseline_ms"] == 500 and kill["peak_ms"] == 4000
    assert kill["on_schedule_s"] == (16_000 + 1400 - fault_ms) / 1000  # 1.4 <= 0.5 + 1
    assert kill["recovery_s"] == (18_000 + 500 - fault_ms) / 1000  # 1.1 s is 0.6 s over
    never = summarize(before, after[:2], fault_ms, batch_ms=1000)
    assert never["on_schedule_s"] is None and not never["recovered"]
    summary = percentiles([kill, kill, never], batch_ms=1000)
    assert summary["on_schedule_p50_s"] == kill["on_schedule_s"]
    assert summary["on_schedule_p50_intervals"] == kill["on_schedule_s"]
    assert summary["on_schedule_p90_s"] is None


MACHINE = {"cores": 2, "cpu": "x", "memory_gb": 1, "os": "y", "python": "3.11"}
MACHINE |= {"pyspark": "4", "java": "17"}
RUN = {
    "started": "2026-11-24T10:00",
    "commit": "abc1234",
    "command": "python -m bench",
    "load_at_start": (1, 1, 1),
    "load_at_end": (1, 1, 1),
}


def one_table_report(directory, workload: str, rows: dict) -> str:
    """The report of a single run whose dstream.worker.pydaemon table holds `rows` for `workload`."""
    from bench.report import write_report
    from bench.throughput.searches import PLANS, Gate

    tables = {"dstream.worker.pydaemon": {workload: rows}}
    gate, plan = Gate(0.25, 10, 2, False), PLANS["full"]
    return write_report(directory, "today", MACHINE, [RUN], tables, {}, gate, plan, []).read_text()


def test_report_prints_no_figure_without_a_confirmation(tmp_path):
    rows = {
        "dstream/tuned": {"status": "confirmed", "rate": 123_000, "processing_p50_ms": 600},
        "pyspark.streaming/tuned": {"status": "no passing rate", "rate": None},
        "structured/plain": {"status": "wrong output", "rate": None, "reason": "batch 7"},
        "structured/expert": {
            "status": "no passing rate",
            "rate": None,
            "trials": [
                {"rate": 50_000, "reason": "processing p90 2938 ms >= interval"},
                {"rate": 100, "reason": "processing p90 1376 ms >= interval"},
                {"rate": 190, "reason": "processing p90 1499 ms >= interval"},
            ],
        },
    }
    text = one_table_report(tmp_path, "wordcount", rows)
    assert "| wordcount | dstream/tuned | confirmed | 123,000 |" in text
    assert "1. started 2026-11-24T10:00, commit abc1234: `python -m bench`" in text
    assert "| wordcount | pyspark.streaming/tuned | no passing rate | none |" in text
    assert (
        "| structured/expert | no passing rate (lowest tried: 100/s, processing p90 1376 ms >= "
        "interval) | none |" in text
    )
    assert "wrong output: batch 7 | none |" in text


def test_a_partial_report_names_what_it_has_not_measured(tmp_path):
    """A run of hours writes after each workload: a stopped run keeps what it measured."""
    from bench.report import write_report
    from bench.throughput.searches import PLANS, Gate

    rows = {"dstream/tuned": {"status": "confirmed", "rate": 90_000}}
    pending = ["topk on dstream.worker.pydaemon", "recovery"]
    tables = {"dstream.worker.pydaemon": {"wordcount": rows}}
    gate, plan = Gate(0.25, 10, 2, False), PLANS["full"]
    text = write_report(tmp_path, "today", MACHINE, [RUN], tables, {}, gate, plan, pending)
    text = text.read_text()
    assert (
        "**Partial**" in text and "not measured: topk on dstream.worker.pydaemon, recovery" in text
    )
    assert "| wordcount | dstream/tuned | confirmed | 90,000 |" in text
    assert "Not run yet." in text and "--no-recovery" not in text
    text = write_report(tmp_path, "today", MACHINE, [RUN], tables, {}, gate, plan, []).read_text()
    assert "Partial" not in text and "--no-recovery" in text
    assert "## Recovery (WordCount)\n" in text  # no daemon named when none ran


def test_a_later_report_of_the_day_keeps_its_hand_written_notes(tmp_path):
    """A diagnosis written under "## Notes" survives the next run's rewrite of the tables."""
    rows = {"dstream/tuned": {"status": "confirmed", "rate": 90_000}}
    first = one_table_report(tmp_path, "wordcount", rows)
    assert "## Notes" not in first
    path = tmp_path / "today.md"
    path.write_text(first + "\n## Notes\n\nwhy the trigger was slow\n")
    rows = {"dstream/tuned": {"status": "confirmed", "rate": 95_000}}
    again = one_table_report(tmp_path, "wordcount", rows)
    assert "| 95,000 |" in again and "| 90,000 |" not in again
    assert again.endswith("\n## Notes\n\nwhy the trigger was slow\n")


def test_a_merged_run_replaces_only_the_rows_it_measured(tmp_path):
    """`--merge`: the day's earlier rows stay, each row names the run that measured it."""
    from bench.report import load_report, write_report
    from bench.run import tag_rows
    from bench.throughput.searches import PLANS, Gate

    gate, plan = Gate(0.25, 10, 2, False), PLANS["full"]
    tables = {
        "dstream.worker.pydaemon": {
            "wordcount": {
                "dstream/tuned": {"status": "confirmed", "rate": 600_000},
                "structured/expert": {"status": "no passing rate", "rate": None},
            }
        }
    }
    tag_rows(tables, 1)
    write_report(tmp_path, "today", MACHINE, [RUN], tables, {}, gate, plan, [])
    earlier = load_report(tmp_path, "today")
    assert earlier is not None and load_report(tmp_path, "another day") is None
    merged = earlier["tables"]
    merged["dstream.worker.pydaemon"]["wordcount"].update(
        {"structured/expert": {"status": "confirmed", "rate": 250_000}}
    )
    tag_rows(merged, 2)
    second = RUN | {"started": "2026-11-24T12:00", "command": "python -m bench --merge"}
    runs = [*earlier["runs"], second]
    text = write_report(tmp_path, "today", MACHINE, runs, merged, {}, gate, plan, [])
    text = text.read_text()
    assert "| wordcount | dstream/tuned | confirmed | 600,000 |" in text
    assert "| 1 |\n" in text.split("dstream/tuned")[1].split("structured/expert")[0]
    assert text.split("structured/expert")[1].split("\n")[0].endswith("| 2 |")
    assert "2. started 2026-11-24T12:00" in text


def test_recovery_table_states_the_run_length_and_a_recovery_not_seen():
    from bench.report import recovery_table

    fault = {"baseline_ms": 400, "first_batch_after_s": 5.6, "peak_ms": 5400}
    recovery = {
        "workload": "wordcount",
        "daemon": "dstream.worker.pydaemon",
        "batches_before": 30,
        "batches_after": 60,
        "dstream": {
            "variant": "tuned",
            "rate": 310_000,
            "driver, local[2]": fault | {"recovery_s": 41.5, "on_schedule_s": 12.0},
            "driver, local-cluster[2,1,1024]": fault | {"recovery_s": None, "on_schedule_s": None},
            "executor, local-cluster[2,1,1024]": {"error": "no executor was killed"},
        },
        "structured": {"skipped": "no confirmed WordCount maximum to take half of"},
    }
    text = "\n".join(recovery_table(recovery))
    assert text.startswith("The fault after 30 batches; 60 batches ran after it.")
    assert (
        "| dstream/tuned | 310,000 | driver, local[2] | 400 ms | 5.6 s | 5,400 ms | 12.0 s "
        "| 41.5 s |" in text
    )
    assert "| 5,400 ms | not within the run | not within the run |" in text
    older = recovery | {"dstream": recovery["dstream"] | {"driver, local[2]": fault}}
    assert "| 5,400 ms |  |  |" in "\n".join(recovery_table(older))  # not measured then
    assert "| executor, local-cluster[2,1,1024] | no executor was killed |" in text
    assert "| structured | | skipped: no confirmed WordCount maximum" in text


def test_profile_attributes_jobs_to_batches_by_either_engines_properties():
    """dstream names a batch's jobs by job group, Spark Streaming by its batch-time property,
    Structured Streaming by its micro-batch id (`triggers`); jobs of none (a state sampler)
    belong to no batch; overlapping jobs count once; a trigger's row sums its jobs."""
    from bench.throughput.profile import covered_ms, jobs_by_batch
    from bench.throughput.triggers import batch_id, operator_row, trigger_row

    def job(job_id: int, properties: dict[str, str], start: int, end: int, stage: int) -> list:
        return [
            {
                "Event": "SparkListenerJobStart",
                "Job ID": job_id,
                "Submission Time": start,
                "Stage IDs": [stage],
                "Properties": properties,
            },
            {"Event": "SparkListenerStageCompleted", "Stage Info": {"Stage ID": stage}},
            {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Metrics": {}},
            {
                "Event": "SparkListenerTaskEnd",
                "Stage ID": stage,
                "Task Metrics": {"Executor Run Time": 30, "Executor CPU Time": 20_000_000},
            },
            {"Event": "SparkListenerJobEnd", "Job ID": job_id, "Completion Time": end},
        ]

    events = (
        job(1, {"spark.jobGroup.id": "dstream-batch-5000"}, 100, 400, 1)
        + job(2, {"spark.jobGroup.id": "dstream-batch-5000"}, 300, 500, 2)
        + job(3, {"spark.streaming.internal.batchTime": "6000"}, 1000, 1200, 3)
        + job(4, {"spark.jobGroup.id": "dstream-state-sampler"}, 0, 50, 4)
        + job(5, {"streaming.sql.batchId": "7"}, 2000, 2100, 5)
        + job(6, {"streaming.sql.batchId": "7"}, 2100, 2150, 6)
    )
    grouped = jobs_by_batch(events)
    assert sorted(grouped) == [5000, 6000]
    assert [(j["stages"], j["tasks"], j["run_ms"]) for j in grouped[5000]] == [(1, 2, 30)] * 2
    assert covered_ms(grouped[5000]) == 400  # 100-500, the overlap counted once
    assert covered_ms(grouped[6000]) == 200
    micro_batches = jobs_by_batch(events, batch_id)
    assert sorted(micro_batches) == [7]
    durations = {"triggerExecution": 900, "addBatch": 700, "walCommit": 40}
    operator = {"numRowsUpdated": 113_000, "numRowsRemoved": 9_000, "allUpdatesTimeMs": 300}
    operator |= {"allRemovalsTimeMs": 50, "commitTimeMs": 20}
    operator |= {"customMetrics": {"rocksdbFilesCopied": 2}}
    row = trigger_row({"durationMs": durations}, micro_batches[7])
    assert (row["triggerExecution"], row["addBatch"], row["queryPlanning"]) == (900, 700, 0)
    assert (row["jobs"], row["stages"], row["tasks"], row["task_cpu"]) == (2, 2, 4, 40)
    assert operator_row(operator) == {
        "updated": 113_000,
        "removed": 9_000,
        "update_ms": 300,
        "remove_ms": 50,
        "commit_ms": 20,
        "files_copied": 2,
    }


def test_ceiling_runs_each_program_unchanged_on_one_partition():
    """The ceiling times the very programs of bench.throughput.programs on one partition; what
    their output operation receives must be that partition's grep count or word counts."""
    from bench.throughput.ceiling import partition_output

    lines = list(textgen.lines(SEED, RECORD_BYTES, 0, 0, 2_000))
    words = Counter(word for line in lines for word in line.split())
    matches = sum(reference.GREP_PATTERN in line for line in lines)
    for variant in ("tutorial", "tuned"):
        assert partition_output("grep", variant, iter(lines)) == [matches]
        for workload in ("wordcount", "topk"):
            assert dict(partition_output(workload, variant, iter(lines))) == words


def test_ceiling_reads_only_confirmed_maxima(tmp_path):
    from bench.throughput.ceiling import measured_maxima

    rows = {
        "dstream/tutorial": {"status": "confirmed", "rate": 300_000},
        "pyspark.streaming/tutorial": {"status": "no passing rate", "rate": None},
    }
    path = tmp_path / "2026-01-01.json"
    path.write_text(json.dumps({"tables": {"dstream.worker.pydaemon": {"wordcount": rows}}}))
    maxima = measured_maxima(path, "dstream.worker.pydaemon")
    assert maxima == {
        ("wordcount", "dstream", "tutorial"): 300_000,
        ("wordcount", "pyspark.streaming", "tutorial"): None,
    }
    assert measured_maxima(path, "pyspark.daemon") == {}


class _FakeWorker:
    """A system of `capacity` records/s (`_verdict`), answering trial commands at once."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def trial(self, command: dict) -> dict:
        verdict = _verdict(command["rate"], self.capacity)
        batch = {"processing_ms": verdict.processing_p50_ms, "time_ms": 0, "end_ms": 500}
        return command | {
            "verdict": vars(verdict),
            "batches": [batch] * command["measured"],
            "checked_batches": command["samples"],
            "seconds": 0.0,
        }


def test_a_search_sets_each_dstream_program_against_the_ceiling_measured_between_its_rounds():
    """Ceilings are measured before every round of the interleaved searches, so each DStream
    engine's row carries the ceiling of its variant's program while it was searched; Structured
    Streaming runs other programs and gets none."""
    from bench.throughput.searches import PLANS, Gate, search_workload

    pairs = [("dstream", "tuned"), ("pyspark.streaming", "tuned"), ("structured", "plain")]
    workers = {"dstream": _FakeWorker(400_000), "pyspark.streaming": _FakeWorker(200_000)}
    workers["structured"] = _FakeWorker(1_000_000)
    plan = PLANS["quick"]
    rows = search_workload(workers, pairs, "grep", plan, Gate(0.25, 10, 0, allow_load=True))
    ours, peer = rows["dstream", "tuned"], rows["pyspark.streaming", "tuned"]
    rounds = max(len(row["trials"]) for row in rows.values())
    assert ours["ceiling"]["samples"] == rounds
    low, high = ours["ceiling"]["range"]
    assert 0 < low <= ours["ceiling"]["median"] <= high
    assert peer["ceiling"] == ours["ceiling"]  # the same measurements
    assert "ceiling" not in rows["structured", "plain"]
    assert ours["rate"] > peer["rate"]


def test_every_trial_of_a_search_keeps_its_latency_so_two_systems_compare_at_one_rate():
    """Not only the deciding trial: a peer's search trial at dstream's published rate says what
    the peer's p99 was there, passed or failed."""
    from bench.throughput.searches import summarize_search

    search = RateSearch(50_000, 6, 0.05, confirm=True)
    figures, events = iter([(1_400.0, 1.0), (2_600.0, 0.97)]), []
    while (planned := search.next_trial()) is not None:
        p99, within = next(figures, (1_500.0 + len(events), 1.0))
        verdict = Verdict(OK if within == 1.0 else SLOW, "", 500.0, 600.0, 0.0, 30, p99, within)
        event = {"rate": planned[0], "confirmation": planned[1], "verdict": vars(verdict)}
        events.append(event | {"batches": [{"processing_ms": 500.0}], "checked_batches": []})
        search.record(*planned, verdict)
    row = summarize_search(search, events, [])
    assert [t["latency_p99_ms"] for t in row["trials"]] == [
        e["verdict"]["latency_p99_ms"] for e in events
    ]
    failed = [t for t in row["trials"] if t["verdict"] == SLOW]
    assert failed and all(t["within_target"] == 0.97 for t in failed)


class _LatencyWorker(_FakeWorker):
    """A fake worker whose batches carry a measured latency (every record within the target),
    and which keeps the commands it ran."""

    def __init__(self, capacity: int, p99_ms: float) -> None:
        super().__init__(capacity)
        self.p99_ms, self.commands = p99_ms, []

    def trial(self, command: dict) -> dict:
        self.commands.append(command)
        event = super().trial(command)
        figures = {"latency_p50_ms": self.p99_ms / 2, "latency_p99_ms": self.p99_ms}
        event["batches"] = [b | figures for b in event["batches"]]
        return event


def _searched(rate: int | None, *failed: int) -> dict:
    """A row whose search confirmed `rate` after failing at the rates `failed`."""
    trials = [
        {"rate": r, "verdict": SLOW, "reason": "late", "latency_p99_ms": 2_600.0} for r in failed
    ]
    trials.append({"rate": 50_000, "verdict": BUSY, "reason": "others used the CPU"})
    return {"status": "confirmed" if rate else "no passing rate", "rate": rate, "trials": trials}


def test_every_peer_is_measured_at_dstreams_rate_unless_its_search_failed_there():
    """At each dstream rate, a peer whose search failed the target at or below it is settled by
    that trial (a busy machine's trial does not count); every other peer runs right after a
    trial of dstream at the same rate, and the report sets their p99s side by side."""
    from bench.throughput.searches import PLANS, Gate, compare_at_dstream_rates

    workers = {
        "dstream": _LatencyWorker(10**9, 1_500.0),
        "pyspark.streaming": _LatencyWorker(10**9, 1_700.0),
        "structured": _LatencyWorker(10**9, 1_200.0),
    }
    rows = {
        "dstream/tutorial": _searched(1_800_000, 2_000_000),
        "dstream/tuned": _searched(1_300_000),
        "pyspark.streaming/tutorial": _searched(1_900_000, 1_500_000),  # confirmed above it
        "pyspark.streaming/tuned": _searched(1_200_000, 1_250_000),
        "structured/plain": _searched(16_000_000),
        "structured/expert": _searched(None, 40_000),
    }
    pairs = [tuple(name.split("/")) for name in rows]
    plan = PLANS["full"]
    gate = Gate(0.25, 10, 0, allow_load=True)
    compare_at_dstream_rates(workers, rows, pairs, "", "grep", plan, gate, frozenset(pairs))

    ran = [(c["variant"], c["rate"]) for c in workers["pyspark.streaming"].commands]
    assert ran == [("tutorial", 1_800_000)]  # the same program only
    assert [(c["variant"], c["rate"]) for c in workers["dstream"].commands] == [
        ("tutorial", 1_800_000),
        ("tuned", 1_300_000),
    ]
    everything = [c for w in workers.values() for c in w.commands]
    assert all(c["measured"] == plan.confirm_measured and c["label"] for c in everything)
    at_rate = rows["dstream/tuned"]["at_this_rate"]
    assert "pyspark.streaming/tutorial" not in at_rate
    at_rate = rows["dstream/tutorial"]["at_this_rate"]
    assert "pyspark.streaming/tuned" not in at_rate
    assert at_rate["structured/expert"] | {"run": None} == {
        "source": "search",
        "rate": 40_000,
        "verdict": SLOW,
        "reason": "late",
        "latency_p99_ms": 2_600.0,
        "within_target": None,
        "run": None,
    }
    settled = rows["dstream/tuned"]["at_this_rate"]["pyspark.streaming/tuned"]
    assert (settled["source"], settled["rate"]) == ("search", 1_250_000)
    assert at_rate["pyspark.streaming/tutorial"]["latency_p99_ms"] == 1_700
    assert at_rate["dstream/tutorial"]["latency_p99_ms"] == 1_500
    assert [c["rate"] for c in workers["structured"].commands] == [1_800_000, 1_300_000]


def test_a_cold_worker_warms_up_at_half_the_rate_before_its_trial_at_dstreams_rate():
    """Without searches before (--same-rate-only), each pair's first trial of the workload is a
    search-length one at half the rate, not counted; later comparisons need none."""
    from bench.throughput.searches import PLANS, Gate, compare_at_dstream_rates

    workers = {"dstream": _LatencyWorker(10**9, 1_500.0)}
    workers["pyspark.streaming"] = _LatencyWorker(10**9, 1_700.0)
    rows = {
        "dstream/tutorial": _searched(1_800_000),
        "dstream/tuned": _searched(1_000_000),
        "pyspark.streaming/tutorial": _searched(1_900_000),
        "pyspark.streaming/tuned": _searched(1_100_000),
    }
    pairs = [tuple(name.split("/")) for name in rows]
    plan = PLANS["full"]
    compare_at_dstream_rates(workers, rows, pairs, "", "grep", plan, Gate(0.25, 10, 0, True))

    peer = [(c["label"], c["rate"], c["measured"]) for c in workers["pyspark.streaming"].commands]
    assert peer == [
        ("warm-up", 900_000, plan.measured),
        ("at rate", 1_800_000, plan.confirm_measured),
        ("warm-up", 500_000, plan.measured),
        ("at rate", 1_000_000, plan.confirm_measured),
    ]
    ours = [(c["label"], c["variant"], c["rate"]) for c in workers["dstream"].commands]
    assert ours[:2] == [("warm-up", "tutorial", 900_000), ("at rate", "tutorial", 1_800_000)]
    assert ours[2:] == [("warm-up", "tuned", 500_000), ("at rate", "tuned", 1_000_000)]
    assert "warm-up" not in json.dumps(rows["dstream/tutorial"]["at_this_rate"])


def test_the_report_sets_each_peers_p99_at_dstreams_rate_against_dstreams(tmp_path):
    trial = {"source": "trial", "verdict": OK, "reason": "ok", "latency_measured": True}
    rows = {
        "dstream/tuned": {
            "status": "confirmed",
            "rate": 300_000,
            "at_this_rate": {
                "dstream/tuned": trial | {"latency_p50_ms": 900, "latency_p99_ms": 1_500},
                "pyspark.streaming/tuned": trial
                | {"latency_p50_ms": 1_000, "latency_p99_ms": 1_700},
                "structured/plain": trial | {"latency_p50_ms": 600, "latency_p99_ms": 1_200},
                "pyspark.streaming/tutorial": {
                    "source": "search",
                    "rate": 200_000,
                    "verdict": SLOW,
                    "reason": "late",
                    "latency_p99_ms": 2_600.0,
                    "within_target": 0.97,
                },
            },
        }
    }
    text = one_table_report(tmp_path, "grep", rows)
    lines = {
        line.split(" | ")[3]: line
        for line in text.splitlines()
        if "| grep | dstream/tuned | 300,000 |" in line
    }
    assert (
        "a trial at this rate | ok | 1,000 ms / 1,700 ms | yes |"
        in lines["pyspark.streaming/tuned"]
    )
    assert "| no: 300 ms higher |" in lines["structured/plain"]
    assert (
        "its search's trial at 200,000/s | too slow: late | worst batch p99 2,600 ms; 97.0% "
        "within | yes: the peer failed the target |"
    ) in lines["pyspark.streaming/tutorial"]
    assert "| 900 ms / 1,500 ms |  |" in lines["dstream/tuned"]


def test_where_both_fail_at_dstreams_rate_the_report_says_so_and_sets_their_p99s_apart():
    from bench.report import no_worse

    failed = {"verdict": SLOW, "latency_p99_ms": 1_148}
    assert no_worse(failed, failed | {"latency_p99_ms": 1_280}) == (
        "both failed the target here; its p99 lower"
    )
    assert no_worse(failed, {"verdict": OK, "latency_p99_ms": 1_000}) == (
        "no: dstream failed the target here; its p99 148 ms higher"
    )
    assert no_worse({"latency_p99_ms": 900}, failed) == "yes: the peer failed the target"
    kept_none = {"verdict": SLOW, "latency_p99_ms": None}  # a search trial of an older run
    assert no_worse(failed, kept_none) == "both failed the target"


def test_report_sets_maxima_against_the_ceiling_and_the_issue_goals(tmp_path):
    ceiling = {"median": 900_000, "range": [850_000, 950_000], "samples": 7}
    rows = {
        "dstream/tuned": {"status": "confirmed", "rate": 720_000, "ceiling": ceiling},
        "pyspark.streaming/tuned": {"status": "confirmed", "rate": 480_000, "ceiling": ceiling},
        "dstream/tutorial": {"status": "confirmed", "rate": 400_000},
        "pyspark.streaming/tutorial": {"status": "no passing rate", "rate": None},
    }
    text = one_table_report(tmp_path, "topk", rows)
    assert "| 900,000 (850,000 to 950,000) | 80% |" in text.split("dstream/tuned")[1]
    # 2 x 480,000 = 960,000, above the ceiling; the tutorial pair has no peer figure to double.
    assert "| topk | tuned | 720,000 | 480,000 | 1.50x | 2.0x | 960,000 | 1.07 |" in text
    assert "| topk | tutorial | 400,000 | none (no passing rate) | no ratio" in text


def test_ceiling_times_the_line_generator_and_the_users_functions_apart():
    """Each part timed on its own, so the table labels what the generator costs and what the
    user's functions cost; both ceilings are derived from them."""
    from bench.throughput.ceiling import ceiling_table, time_per_line

    times = time_per_line("grep", "tuned", lines=2_000, rounds=1)
    assert times.generator_s > 0 and times.functions_s > 0
    assert times.total_s == times.generator_s + times.functions_s
    rows = list(ceiling_table(2, 2_000, 1, {("grep", "dstream", "tuned"): 1000}))
    header = rows[0]
    assert "line generator |" in header and "user's functions |" in header
    assert "user's functions alone" in header and "line generator + user's functions" in header
    grep_tuned = next(r for r in rows if r.startswith("| grep | tuned |"))
    cells = [c.strip() for c in grep_tuned.strip("|").split("|")]
    alone, together = (int(c.replace(",", "")) for c in cells[4:6])
    assert alone > together  # the generator's time is not in the first ceiling
    assert cells[6] == "1,000"
    assert len(rows) == 2 + 6  # header, rule, 3 workloads x 2 variants


def test_pyspark_streamings_latency_follows_the_rate_schedule_like_dstreams_source():
    """300 records/s: interval 2 (batch at origin + 2 s) holds records 300..599, record v
    arriving ceil((v + 1) * 1000 / 300) ms after the origin; ended 400 ms after its batch time,
    the 150th of its 300 latencies is record 450's, 400 + 2000 - 1504 ms, and the 297th record
    303's, 400 + 2000 - 1014 ms."""
    from bench.throughput.systems import scheduled_latency

    measured = scheduled_latency(300, origin_ms=10_000, time_ms=12_000, end_ms=12_400)
    assert measured is not None and measured.records == 300
    assert (measured.p50_s, measured.p99_s) == (0.896, 1.386)


def test_the_report_gives_measured_latency_only():
    from bench.report import latency_cell
    from bench.throughput.trial import measured_latency

    batches = [
        {"latency_p50_ms": 600.0, "latency_p99_ms": 1000.0},
        {"latency_p50_ms": 700.0, "latency_p99_ms": 1400.0},
        {"latency_p50_ms": 650.0, "latency_p99_ms": 1100.0},
    ]
    row = measured_latency(batches, 2000)
    assert row == {"latency_p50_ms": 650, "latency_p99_ms": 1400, "latency_measured": True}
    assert latency_cell(row) == "650 ms / 1,400 ms"
    counted = [b | {"latency_buckets": _buckets(s1_0=199, s1_5=1)} for b in batches]
    row = measured_latency(counted, 1000)
    assert row["within_target"] == pytest.approx(0.995) and row["latency_target_ms"] == 1000
    assert latency_cell(row) == "650 ms / 1,400 ms; 99.5% within 1 s"
    assert measured_latency([{"latency_p50_ms": None, "latency_p99_ms": None}], 2000) == {}
    modelled = {"latency_p50_ms": 900, "latency_p99_ms": 1500}  # a row of an earlier run
    assert latency_cell(modelled) == "not measured"


@pytest.mark.solo  # a trial on a real job, as test_same_program_passes_the_checker_on_a_real_job
@pytest.mark.parametrize(
    ("system_name", "variant"),
    [("dstream", "tuned"), ("pyspark.streaming", "tuned"), ("structured", "plain")],
)
def test_half_second_batches_hold_half_an_interval_and_pass_the_checker(sc, system_name, variant):
    """--batch-interval 500: each system runs the 30 s window over 500 ms batches (Structured
    Streaming: triggers); batch k holds the records of the k-th half second (checked against
    the reference with the same interval), and each record waited at most half a second more
    than its batch's delay."""
    from bench.throughput.systems import SYSTEM_CLASSES
    from bench.throughput.worker import restricted_output

    system = SYSTEM_CLASSES[system_name](sc, 2)
    run = system.run("wordcount", variant, 300, 2, 4, timeout_s=300, batch_ms=500)
    assert len(run.batches) == 4
    times = [b.time_ms for b in run.batches]
    assert [b - a for a, b in itertools.pairwise(times)] == [500] * 3
    restricted = restricted_output(system_name, variant, "wordcount")
    check = check_outputs(
        "wordcount", 300, 2, run.outputs, run.intervals, 4, restricted, batch_ms=500
    )
    assert check.ok, check.reason
    assert run.intervals == list(range(run.intervals[0], run.intervals[0] + 4))
    for batch in run.batches:
        waited = batch.end_ms - batch.time_ms
        assert batch.latency_p50_ms is not None and batch.latency_p99_ms is not None
        assert waited <= batch.latency_p50_ms <= batch.latency_p99_ms <= waited + 500
        assert batch.latency_buckets is not None and sum(batch.latency_buckets) == 150


def _buckets(**records_by_bound: int) -> list[int]:
    """Records per LATENCY_BUCKETS_S bucket, given by bound (`s1_5=3`: 3 records in the
    bucket up to 1.5 s)."""
    from dstream.runtime.control.latency import LATENCY_BUCKETS_S

    counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
    for name, records in records_by_bound.items():
        counts[LATENCY_BUCKETS_S.index(float(name[1:].replace("_", ".")))] += records
    return counts


def test_a_trial_passes_only_with_the_p99_of_its_records_within_the_papers_target():
    """p99 end-to-end latency within two intervals (2 s with 1 s batches, 1 s with 500 ms) over
    all of a trial's records: one late batch among many fails it only if it holds more than
    1% of the records outside the target."""
    keeps_up = ([500.0] * 30, [0.0] * 30, 30, True, "ok")
    p99s = [1500.0] * 29 + [2400.0]
    mostly = [_buckets(s1_5=100)] * 29 + [_buckets(s2_0=80, s3_0=20)]  # 20 of 3,000 late
    passed = judge(*keeps_up, latency_p99_ms=p99s, latency_buckets=mostly)
    assert passed.kind == OK and passed.within_target == pytest.approx(2980 / 3000)
    assert passed.latency_p99_ms == 2400.0  # the worst batch's, reported
    late = [_buckets(s1_5=100)] * 28 + [_buckets(s2_0=50, s3_0=50)] * 2  # 100 of 3,000 late
    failed = judge(*keeps_up, latency_p99_ms=p99s, latency_buckets=late)
    assert failed.kind == SLOW and "p99 over 2000 ms: 96.67% of the records" in failed.reason
    unmeasured = judge(*keeps_up, latency_p99_ms=p99s, latency_buckets=mostly[:29] + [None])
    assert unmeasured.kind == SLOW and "29/30" in unmeasured.reason
    half = [_buckets(s0_75=50, s1_0=49, s1_5=1)] * 30
    assert judge([450.0] * 30, [0.0] * 30, 30, True, "ok", 500, None, half).kind == OK
    over = [_buckets(s0_75=50, s1_0=48, s1_5=2)] * 30
    assert judge([450.0] * 30, [0.0] * 30, 30, True, "ok", 500, None, over).kind == SLOW


def test_half_second_batches_are_judged_and_searched_against_their_interval():
    fits = judge([450.0] * 30, [0.0] * 30, 30, True, "ok", interval_ms=500)
    assert fits.kind == OK
    slow = judge([600.0] * 30, [0.0] * 30, 30, True, "ok", interval_ms=500)
    assert slow.kind == SLOW and "p90" in slow.reason
    half = RateSearch(50_000, 6, 0.1, True, interval_ms=500)
    assert half.target_ms == pytest.approx(475)
    assert feed.batch_slices(300, 2, 3, 500) == [(0, 150, 225), (1, 150, 225)]


def test_a_batch_interval_whose_latency_target_the_histogram_cannot_count_is_refused(capsys):
    from bench.run import main

    with pytest.raises(SystemExit):
        main(["--batch-interval", "3000", "--no-recovery", "--quick"])
    assert "--batch-interval 3000: its latency target (2 intervals, 6 s)" in capsys.readouterr().err


def test_half_second_trials_last_as_long_and_a_confirmation_fills_the_window():
    """A 500 ms plan runs twice the batches of the 1 s plan: the same seconds of warm-up and
    measure, and a confirmation whose 30 s window is full for most of its measured batches."""
    from bench.report import plan_line
    from bench.throughput.searches import PLANS

    full = PLANS["full"]
    half = full.at_interval(500)
    assert (half.warmup, half.measured) == (2 * full.warmup, 2 * full.measured)
    window = reference.WINDOW_BATCHES * 1000 // half.batch_ms
    assert half.confirm_warmup + half.confirm_measured - window > half.confirm_measured / 2
    assert plan_line(half) == plan_line(full).replace("last 31 s", "last 30.5 s")


def test_a_trial_is_measured_from_the_first_batch_after_its_warm_up_that_started_on_time():
    """A new job's slow first batches queue the next ones: the measure starts once a batch
    started within a tenth of an interval of its time, and waits for as many batches after it."""
    from bench.throughput.systems import Batch, System

    system = System(None, 2)
    system.batch_ms = 500
    draining = [0, 1900, 1400, 900, 400, 60, 40, 0, 0, 0]  # the 2 warm-up batches, then a queue
    for i, delay in enumerate(draining):
        system._record(Batch(i * 500, 1, delay, 300, 0, i))
    assert system._run_until_settled(warmup=2, then=4, timeout_s=5.0) == 4
    never = System(None, 2)
    never.batch_ms = 500
    for i in range(8):
        never._record(Batch(i * 500, 1, 600 + 100 * i, 600, 0, i))
    assert never._run_until_settled(warmup=2, then=4, timeout_s=0.2) == 6


def test_kafka_offsets_read_are_checked_against_the_reference_of_those_offsets():
    """A broker's batches hold what had arrived, not an interval: the reference is computed
    from the slices each batch read (window: the batches' slices together)."""
    inputs = {1: ((0, 0, 70), (1, 0, 65)), 2: ((0, 70, 150), (1, 65, 150)), 3: ()}
    lines = textgen.lines(SEED, RECORD_BYTES, 0, 0, 150) + textgen.lines(
        SEED, RECORD_BYTES, 1, 0, 150
    )
    truth = {2: count_digest(Counter(w for line in lines for w in line.split()))}
    assert check_outputs("wordcount", 0, 2, truth, [2], 1, inputs=inputs).ok
    one_more = {**inputs, 2: ((0, 70, 151), (1, 65, 150))}  # a record it did not read
    assert not check_outputs("wordcount", 0, 2, truth, [2], 1, inputs=one_more).ok
    grep = {
        2: sum(
            reference.GREP_PATTERN in line
            for p in (0, 1)
            for line in textgen.lines(SEED, RECORD_BYTES, p, *inputs[2][p][1:])
        )
    }
    assert check_outputs("grep", 0, 2, grep, [2], 1, inputs=inputs).ok
    unknown = check_outputs("grep", 0, 2, grep, [4], 1, inputs=inputs)
    assert not unknown.ok and "batch 4: its input was not recorded" in unknown.reason


def test_kafka_feed_stamps_records_on_the_rate_schedule_and_latency_follows():
    """Record v's Kafka timestamp is origin + v * 1000 // rate, so interval k's records fall in
    event-time window k; a micro-batch's latency comes from those timestamps."""
    from bench.throughput.kafka_input import Fed, records_by, timestamp_ms
    from bench.throughput.systems import progress_slices

    rate, origin = 300, 1_000_000
    firsts = [timestamp_ms(origin, rate, v) for v in (0, 299, 300)]
    assert firsts == [origin, origin + 996, origin + 1000]
    assert records_by(origin, rate, origin - 1) == 0
    assert records_by(origin, rate, origin + 999) == 300  # all of interval 1
    fed = Fed("127.0.0.1:1", "t", 2, rate, origin)
    interval_one = reference.interval_slices(rate, 2, 1)
    committed = fed.latency(list(interval_one), origin + 1500)
    assert committed is not None and committed.records == 300
    assert 0.5 <= committed.p50_s <= 1.0 < committed.p99_s <= 1.5
    assert fed.latency([(0, 5, 5)], origin) is None
    progress = {"sources": [{"startOffset": None, "endOffset": {"t": {"1": 9, "0": 10}}}]}
    assert progress_slices(progress) == ((0, 0, 10), (1, 0, 9))
    later = {
        "sources": [
            {"startOffset": {"t": {"0": 10, "1": 9}}, "endOffset": {"t": {"0": 12, "1": 9}}}
        ]
    }
    assert progress_slices(later) == ((0, 10, 12), (1, 9, 9))


@pytest.fixture(scope="module")
def bench_broker(tmp_path_factory):
    from bench.throughput.kafka_input import start_broker

    server = start_broker(tmp_path_factory.mktemp("bench-kafka"))
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.solo  # a trial on a real job (among the parallel tests: 1 of 3 batches measured)
@pytest.mark.timeout(600)  # a worker's JVM start, then two trials given up to 240 s each
@pytest.mark.parametrize(
    ("system_name", "variant"), [("dstream", "tuned"), ("structured", "expert")]
)
def test_a_kafka_trial_reads_the_fed_topic_and_passes_the_checker(
    bench_broker, system_name, variant, monkeypatch
):
    """`--source kafka` end to end, as `python -m bench` runs it: the system's worker process
    (Structured Streaming with spark-sql-kafka on its classpath) reads a topic fed at the
    trial's rate, and its WordCount and Grep outputs match the reference of what it read (a
    tiny rate: about correctness, not speed); every measured batch's latency is measured. Both
    workloads run on one worker, as a run's trials do. The worker's JVM runs the quick JIT
    only, as the tests' SparkContext does (a benchmark's keeps both compilers): measured
    alone, Structured Streaming's trial took 100 CPU-seconds with C2 and 46 without."""
    from running_driver import QUICK_JIT

    from bench.throughput.searches import Worker

    monkeypatch.setenv("JAVA_TOOL_OPTIONS", QUICK_JIT)
    worker = Worker(system_name, "dstream.worker.pydaemon", kafka=bench_broker.bootstrap)
    try:
        events = []
        for workload in ("wordcount", "grep"):
            command = {"workload": workload, "variant": variant, "rate": 200, "warmup": 2}
            command |= {"measured": 3, "samples": 3, "confirmation": False, "timeout_s": 240}
            events.append(worker.trial(command))
    finally:
        worker.close()
    for event in events:
        verdict = event["verdict"]
        assert verdict["kind"] != WRONG, (event["workload"], verdict["reason"])
        assert len(event["checked_batches"]) == 3 and verdict["batches"] == 3
        assert sum(b["records"] for b in event["batches"]) > 0
        assert all(b["latency_p99_ms"] is not None for b in event["batches"])


def test_a_rate_that_failed_on_latency_is_bisected_not_crept_up_to():
    """Processing time says nothing about an edge set by latency: with 200,000 passing and
    800,000 failing on latency in 300 ms batches, the next rate is the bracket's middle, not
    just under 800,000 as the processing-time line would put it."""
    search = RateSearch(200_000, max_trials=6, tolerance=0.1, confirm=True)
    fast = judge([300.0] * 30, [0.0] * 30, 30, True, "ok")
    late = Verdict(SLOW, "latency p99 over 2000 ms", 300.0, 350.0, 0.0, 30)
    search.record(200_000, False, fast)
    search.record(800_000, False, late)
    assert search.next_trial() == (400_000, False)


def test_events_emitted_from_two_threads_at_once_stay_whole_lines():
    """A recovery subject emits batches from Spark's listener thread and kills from its own,
    into a pipe (print's separate write of the newline let another thread's line in between)."""
    program = """if True:
        import threading
        from bench.common import emit

        def emit_many(source):
            for n in range(3000):
                emit(event=source, n=n, padding="x" * 200)

        threads = [threading.Thread(target=emit_many, args=(s,)) for s in ("batch", "killed")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    """
    out = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    events = [json.loads(line) for line in out.splitlines()]
    assert Counter(e["event"] for e in events) == {"batch": 3000, "killed": 3000}


def test_each_executor_kill_waits_one_batch_longer_than_the_one_before(monkeypatch, capsys):
    """So that the kills of a run fall at every phase of the state checkpoints (bench/recovery/
    subject.py): with a gap of 30 batches and checkpoints every 10, every kill fell at one."""
    from bench.recovery import subject

    class Batches:
        batch_ms = 1000

        def __init__(self) -> None:
            self.done = 0
            self.killed_at: list[int] = []

        def wait_for(self, count: int, deadline: float) -> None:
            self.done = max(self.done, count)

        def wait_until_on_schedule(self, since: int, in_a_row: int, deadline: float) -> None:
            self.killed_at.append(self.done)

        def completed(self) -> int:
            return self.done

    monkeypatch.setattr(subject, "kill_one_executor", lambda: 4242)
    batches = Batches()
    needed = subject.kill_executors(batches, 20, kills=4, every=30, deadline=float("inf"))
    assert batches.killed_at == [20, 50, 81, 113]
    assert needed == 113 + 33
    kills = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [k["pid"] for k in kills] == [4242] * 4
