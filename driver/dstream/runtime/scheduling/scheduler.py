"""The batch scheduler: a timer that marks batch times due on the interval grid, and a runner that
sizes and executes batches in order.

Per batch: size its input when it starts (within the rate limit in force then) -> write the batch
record -> run the output jobs -> write the commit marker -> forget old RDDs and log entries ->
notify listeners; the record, the outputs and the commit each run again under the failure policy
when they fail (failure.py). Spark's JobGenerator sizes a batch when its time comes, so batches
queued behind a slow one keep ranges planned under an old rate and backpressure cannot pull a job
out of a deep overload; sizing at start means every batch runs under the newest rate.

With backpressure on, batch times that fell due while the runner was busy are *coalesced*: the
latest due time runs, with one interval's budget, and the earlier ones are not batches: no input,
no output, no state step (their records wait at the source, visible as lag). State and windows
step from the last batch that ran (DStream._previous_time), so they stay exact over the records
admitted, and a batch's lineage does not grow with the number of coalesced times. With
backpressure off every batch time runs with what arrived in its interval, as in
pyspark.streaming, which keeps a rate source's batches a pure function of time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dstream.runtime.checkpoint import durable
from dstream.runtime.checkpoint.directory import CheckpointDir
from dstream.runtime.checkpoint.files import CheckpointWriteError, fault_point
from dstream.runtime.checkpoint.recovery import CheckpointRecovery, Recovery
from dstream.runtime.control import latency
from dstream.runtime.control.failure import BatchFailedError, FailurePolicy
from dstream.runtime.leadership.fencing import DeposedError, Fence
from dstream.runtime.leadership.leader import Leadership
from dstream.runtime.scheduling import pools, timeline
from dstream.runtime.scheduling.batch import BatchEvent, BatchInfo, BatchOutcome
from dstream.runtime.scheduling.retries import FINAL_FAILURES, BatchRetries
from dstream.runtime.timeutil import datetime_of

if TYPE_CHECKING:
    from pyspark import SparkContext

    from dstream.runtime.control.backpressure import RateController
    from dstream.runtime.scheduling.clock import ManualClock, SystemClock
    from dstream.runtime.scheduling.graph import DStreamGraph

log = logging.getLogger(__name__)
HISTORY = 1000
# Spark writes a marked RDD's marked ancestors in the same job too, not only the RDD: a window
# and its durable batch reductions are both marked in the batches that checkpoint the window.
CHECKPOINT_ALL_MARKED = "spark.checkpoint.checkpointAllMarkedAncestors"


def _describe(failure: Exception) -> str:
    return f"{type(failure).__name__}: {failure}"


def _planning_failed(time_ms: int, error: Exception) -> BatchFailedError:
    """A batch whose input could not be sized: the run ends there, as after spent retries."""
    failed = BatchFailedError(
        f"batch {datetime_of(time_ms)} ({time_ms}) could not be planned and the run stopped: "
        f"{_describe(error)}"
    )
    failed.__cause__ = error
    return failed


class BatchScheduler:
    """Runs the batches of one StreamingContext on its SparkContext `sc`. It knows the context
    only through the callables it is given, as the runtime sits below the public API:
    `report_error` receives each failed attempt of a batch (for awaitTermination to raise),
    `checkpoint_metadata(zero_ms)` makes the checkpoint's metadata (the pickled graph and its
    settings) at a fresh start or a recovery."""

    def __init__(
        self,
        sc: SparkContext,
        graph: DStreamGraph,
        clock: SystemClock | ManualClock,
        checkpoint: CheckpointDir | None,
        rate_controllers: dict[str, RateController],
        failure_policy: FailurePolicy | None = None,
        *,
        report_error: Callable[[BaseException], None],
        checkpoint_metadata: Callable[[int], dict[str, Any]],
    ):
        self._sc = sc
        self._report_error = report_error
        self._checkpoint_metadata = checkpoint_metadata
        self._graph = graph
        self.clock = clock
        self._checkpoint = checkpoint
        self.rate_controllers = rate_controllers
        self.failure_policy = failure_policy or FailurePolicy()
        self._due: deque[int] = deque()  # batch times whose time has come, not yet started
        self._replays: deque[BatchInfo] = deque()  # uncommitted batches found at recovery
        self._wakeup = threading.Condition()
        self._stopping = False
        self._stop_generating = threading.Event()
        self._threads: list[threading.Thread] = []
        self._listeners: list[Any] = []
        self.history: deque[BatchInfo] = deque(maxlen=HISTORY)
        self.current: BatchInfo | None = None
        self.recovery: Recovery | None = None
        self.leadership = (
            Leadership(sc, graph, checkpoint, self._deposed) if checkpoint is not None else None
        )
        self.state = "initialized"
        self._completed = threading.Condition()

    # -- listeners ------------------------------------------------------------------------

    def add_listener(self, listener: Any) -> None:
        self._listeners.append(listener)

    def _notify(self, method: str, info: BatchInfo) -> None:
        for listener in list(self._listeners):
            handler = getattr(listener, method, None)
            if handler is None:
                continue
            try:
                handler(BatchEvent(info))
            except Exception:
                log.exception("streaming listener %r failed in %s", listener, method)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, standby: bool = False) -> None:
        """Take the checkpoint's lead (as a `standby` whose lead is held, wait for it, following
        the checkpoint), recover from it or start fresh, and start the timer and the runner."""
        if self.leadership is not None:
            self._lead(self.leadership, standby)
        try:
            first_ms = self._recover() if self._checkpoint and self._checkpoint.exists() else None
            if first_ms is None:
                first_ms = self._start_fresh()
        except BaseException:
            self.hand_over()  # refused (mismatch, unrecoverable, deposed): not leading
            raise
        self.state = "recovering" if self.recovery and self.recovery.replayed else "running"
        if self.recovery and self.state == "running":
            timeline.mark("replayed")  # nothing to replay
        self._threads = [
            threading.Thread(
                target=self._generate_loop, args=(first_ms,), name="dstream-timer", daemon=True
            ),
            threading.Thread(target=self._run_loop, name="dstream-runner", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    @property
    def fence(self) -> Fence | None:
        """The fence this driver writes under: None without a checkpoint, or before it leads."""
        return self.leadership.fence if self.leadership is not None else None

    def _lead(self, leadership: Leadership, standby: bool) -> None:
        leadership.take(standby, following=self._enter_standby)
        timeline.mark("lead_taken")

    def _enter_standby(self) -> None:
        """The lead is held by another driver: this one follows the checkpoint until it is free."""
        self.state = "standby"

    def _deposed(self, error: DeposedError) -> None:
        """A newer driver leads: no new batch starts, and awaitTermination raises the error."""
        self._stop_generating.set()
        self._report_error(error)

    def _start_fresh(self) -> int:
        batch = self._graph.batch_ms
        first_ms = (self.clock.now_ms() // batch + 1) * batch
        self._graph.start(first_ms - batch)
        if self._checkpoint is not None:
            self._checkpoint.write_metadata(self._checkpoint_metadata(first_ms - batch))
        return first_ms

    def _recover(self) -> int:
        """Recover from the checkpoint (checkpoint/recovery.py) and queue its uncommitted batches
        to run first, each with the ranges its record holds; the first new time."""
        assert self._checkpoint is not None and self.leadership is not None
        verified, shadow = self.leadership.stop_following()
        self.recovery = CheckpointRecovery(
            self._sc,
            self._graph,
            self._checkpoint,
            self._checkpoint_metadata,
            self.fence,
            verified,
            shadow,
        ).run()
        timeline.mark("state_restored")
        for time_ms, record in self.recovery.pending_records.items():
            info = BatchInfo(
                time_ms,
                self.clock.now_ms(),
                {s.name: s.records_in(record["ranges"][s.name]) for s in self._graph.inputs},
                dict(record.get("rateLimits", {})),
                kind="replayed",
                coalesced=list(record.get("coalesced", [])),
                ranges=dict(record["ranges"]),
            )
            self._replays.append(info)
        return self.recovery.resume_ms

    def stop(self) -> None:
        """Stop marking batch times due and let the running batch finish and commit. Times that
        are due but not started have no batch record yet, so nothing is lost: a restart from the
        checkpoint runs them (replayed batches found at recovery are re-run the same way)."""
        self.state = "stopping"
        self._stop_generating.set()
        if self._threads:
            self._threads[0].join()
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
        if len(self._threads) > 1:
            self._threads[1].join()
        self.hand_over()
        self.state = "stopped"

    def hand_over(self) -> None:
        """Let go of the lead now, before the running batch ends, for a standby to take over
        at once; this driver goes on writing under its epoch. Its batch commits if it gets
        there before the standby claims the next epoch; after that its writes are refused
        (DeposedError) and the standby runs the batch again."""
        if self.leadership is not None:
            self.leadership.hand_over()

    # -- the timer ------------------------------------------------------------------------

    def _generate_loop(self, first_ms: int) -> None:
        """Mark each batch time due when the clock reaches it; nothing is planned yet."""
        next_ms = first_ms
        while self.clock.wait_until(next_ms, self._stop_generating):
            with self._wakeup:
                self._due.append(next_ms)
                self._wakeup.notify_all()
            next_ms += self._graph.batch_ms

    def pending_batches(self) -> int:
        """Batch times due (or recovered) and not yet started."""
        return len(self._due) + len(self._replays)

    @property
    def coalescing(self) -> bool:
        """Due times are merged only under backpressure: without it a batch's input is exactly
        what arrived in its interval, and every batch time must run to keep it so."""
        return bool(self.rate_controllers)

    # -- the runner -----------------------------------------------------------------------

    def _run_loop(self) -> None:
        """Run batches until stopped. The JVM keeps local properties per thread, and every
        batch's jobs run on this one: those that never change are set once, here."""
        pools.use_pool(self._sc, pools.BATCHES)
        self._sc.setLocalProperty(CHECKPOINT_ALL_MARKED, "true")
        while (taken := self._take_next()) is not None:
            if isinstance(taken, BatchInfo):
                info = taken
            else:
                try:
                    info = self._plan(taken)
                except Exception as error:
                    log.exception("planning batch %s failed", datetime_of(taken[-1]))
                    self._report_error(_planning_failed(taken[-1], error))
                    return
            if not self._run(info):
                return
            if self.state == "recovering" and not self._replays:
                self.state = "running"
                timeline.mark("replayed")

    def _take_next(self) -> BatchInfo | list[int] | None:
        """A recovered batch first, else the due times the next batch stands for (all of them
        when coalescing); None once stopping."""
        with self._wakeup:
            self._wakeup.wait_for(lambda: self._stopping or self._replays or self._due)
            if self._stopping:
                return None
            if self._replays:
                return self._replays.popleft()
            count = len(self._due) if self.coalescing else 1
            return [self._due.popleft() for _ in range(count)]

    def _plan(self, times: list[int]) -> BatchInfo:
        """Size the batch at times[-1] under the rate limits in force now and merge the earlier
        due times into it; _run logs its record before any task runs."""
        time_ms, coalesced = times[-1], times[:-1]
        now = self.clock.now_ms()
        self._graph.coalesce(coalesced)
        ranges, records, limits, limited = {}, {}, {}, {}
        for source in self._graph.inputs:
            controller = self.rate_controllers.get(source.name)
            budget = controller.max_records() if controller else None
            ranges[source.name] = source.plan(time_ms, budget)
            records[source.name] = source.records_in(ranges[source.name])
            limits[source.name] = controller.rate_limit if controller else None
            limited[source.name] = source.held_back(ranges[source.name], budget)
        record: dict[str, Any] | None = None
        if self._checkpoint is not None:
            record = {
                "ranges": ranges,
                "rateLimits": limits,
                "positions": {s.name: s.position() for s in self._graph.inputs},
            }
            if coalesced:
                record["coalesced"] = coalesced
        late = now - time_ms >= self._graph.batch_ms
        info = BatchInfo(
            time_ms,
            time_ms,
            records,
            limits,
            kind="catch-up" if late else "live",
            coalesced=coalesced,
            ranges=ranges,
            limited=limited,
            record=record,
        )
        self._notify("onBatchSubmitted", info)
        return info

    def _run(self, info: BatchInfo) -> bool:
        """Record the batch, run its outputs and commit it, each under the failure policy. False
        when it failed for good (or while stopping) and stays uncommitted: the runner ends, and
        a restart runs the batch again from its record, or plans it again if it has none."""
        time_ms = info.batch_time_ms
        info.processing_start_ms = self.clock.now_ms()
        self.current = info
        self._notify("onBatchStarted", info)
        self._sc.setJobGroup(f"dstream-batch-{time_ms}", f"batch {datetime_of(time_ms)}", True)
        outcome = self._execute(info)
        info.skipped = outcome.status == "skipped"
        if outcome.error is not None:
            info.error = _describe(outcome.error)
        info.processing_end_ms = self.clock.now_ms()
        if outcome.status != "uncommitted" and self._checkpoint is not None:
            self._prune(time_ms)  # its commit marker is written: housekeeping, not processing
        ages = self._record_ages(info)
        if outcome.status == "committed":
            info.latency = latency.summarize(ages, info.processing_end_ms - time_ms)
        self._graph.clear_metadata(time_ms)
        self.current = None
        self.history.append(info)
        if outcome.status == "committed":
            self._update_rates(info)
            if info.kind == "live" and (info.schedulingDelay() or 0) < self._graph.batch_ms:
                timeline.mark("on_schedule")
        self._notify("onBatchCompleted", info)
        with self._completed:
            self._completed.notify_all()
        if outcome.status != "uncommitted":
            return True
        assert outcome.error is not None
        self._give_up(info, outcome.error)
        return False

    def _record_ages(self, info: BatchInfo) -> latency.Ages:
        """The ages of the batch's records at its batch time, from every source that knows
        them; taken whatever the outcome, so that the sources' task reports do not pile up."""
        return latency.merged(
            source.record_ages(info.batch_time_ms, info.ranges[source.name])
            for source in self._graph.inputs
            if source.name in info.ranges
        )

    def _execute(self, info: BatchInfo) -> BatchOutcome:
        """Record the batch, run its outputs and commit it. Outputs that failed for good are
        committed past as skipped only under onExhausted: skip; a checkpoint that cannot be
        written is never skipped past: without the batch's record and commit a restart could
        not tell what it read, so the batch stays uncommitted and the run stops there."""
        retries = BatchRetries(info, self.failure_policy, self._report_error, self._wait_for_stop)
        failure = self._write_record(info, retries)
        if failure is not None:
            return BatchOutcome("uncommitted", failure)
        failure = self._run_outputs(info, retries)
        info.state_checkpoints = self._graph.completed_checkpoints()
        if failure is not None and not (self.failure_policy.skips and not self._stopping):
            return BatchOutcome("uncommitted", failure)
        outcome = BatchOutcome("committed") if failure is None else BatchOutcome("skipped", failure)
        commit_failure = self._commit(info, outcome, retries)
        if commit_failure is not None:
            return BatchOutcome("uncommitted", commit_failure)
        return outcome

    def _write_record(self, info: BatchInfo, retries: BatchRetries) -> Exception | None:
        """Log the batch's input ranges before any of its tasks runs (a replayed batch already
        has its record)."""
        record = info.record
        if self._checkpoint is None or record is None:
            return None
        checkpoint = self._checkpoint
        failure = self._write_checkpoint(
            info,
            retries,
            "writing its batch record",
            lambda: checkpoint.write_batch(info.batch_time_ms, record, self.fence),
        )
        if failure is None:
            info.record = None  # history keeps the batch, not its record
        return failure

    def _write_checkpoint(
        self, info: BatchInfo, retries: BatchRetries, step: str, write: Callable[[], None]
    ) -> Exception | None:
        """A checkpoint write retried under the failure policy while the storage refuses it
        (read-only, full), its time added to the batch's checkpoint_seconds."""

        def attempt() -> Exception | None:
            started = time.perf_counter()
            try:
                write()
            except (CheckpointWriteError, *FINAL_FAILURES) as error:
                return error
            finally:
                spent = time.perf_counter() - started
                info.checkpoint_seconds = (info.checkpoint_seconds or 0.0) + spent
            return None

        return retries.run(step, attempt)

    def _run_outputs(self, info: BatchInfo, retries: BatchRetries) -> Exception | None:
        """Run the batch's output operations, then write the durable partitions they did not
        compute; what fails runs again under the failure policy (outputs that succeeded do
        not run again). The batch's RDDs are generated once, so a retry reads the same input
        ranges."""
        time_ms = info.batch_time_ms
        pending = list(self._graph.outputs)

        def attempt() -> Exception | None:
            failures = []
            for output in pending:
                try:
                    output.run(time_ms, self.fence)
                except Exception as error:
                    log.error("batch %s: output job failed: %s", datetime_of(time_ms), error)
                    failures.append((output, durable.part_write_failure(error) or error))
            pending[:] = [output for output, _error in failures]
            if failures:
                return failures[0][1]
            try:
                self._graph.write_missing_parts()
            except Exception as error:
                log.error(
                    "batch %s: writing durable batches failed: %s", datetime_of(time_ms), error
                )
                return durable.part_write_failure(error) or error
            return None

        return retries.run("running its outputs", attempt)

    def _wait_for_stop(self, seconds: float) -> bool:
        """Wait up to `seconds` (a retry's backoff); whether a stop came meanwhile."""
        with self._wakeup:
            return self._wakeup.wait_for(lambda: self._stopping, seconds)

    def _give_up(self, info: BatchInfo, failure: Exception) -> None:
        """Leave the batch uncommitted and end the run: its record stays in the log, so the
        next start re-runs it with the same input instead of losing its output."""
        time_ms = info.batch_time_ms
        if self._stopping:
            log.warning(
                "batch %s left uncommitted by the stop while it was failing; a restart runs it "
                "again",
                datetime_of(time_ms),
            )
            return
        log.error(
            "batch %s failed after %d retries; stopping without committing it (a restart runs "
            "it again with the same input): %s",
            datetime_of(time_ms),
            info.retries,
            info.error,
        )
        message = (
            f"batch {datetime_of(time_ms)} ({time_ms}) failed after {info.retries} retries and "
            f"was not committed: {info.error}"
        )
        error = BatchFailedError(message)
        error.__cause__ = failure
        self._report_error(error)

    def _update_rates(self, info: BatchInfo) -> None:
        """Each controller learns from the batch; a replayed batch counts as not limited (its
        range was planned by an earlier driver, under that driver's limit)."""
        for source_name, controller in self.rate_controllers.items():
            controller.update(
                info.processing_end_ms or 0,
                info.records.get(source_name, 0),
                info.processingDelay() or 0,
                info.schedulingDelay() or 0,
                limited=info.limited.get(source_name, False),
            )

    def _commit(
        self, info: BatchInfo, outcome: BatchOutcome, retries: BatchRetries
    ) -> Exception | None:
        """Mark the batch done in the log, retrying under the failure policy; the failure when
        the marker could not be written. A skipped batch (failurePolicy onExhausted: skip) is
        marked too, with its error and the input ranges it skipped: the run moved on past it,
        so a restart must not re-run it after later batches."""
        if self._checkpoint is None:
            return None
        checkpoint = self._checkpoint
        fault_point("before-commit")
        commit: dict[str, Any] = {"state": info.state_checkpoints}
        stores = self._graph.committed_versions(info.batch_time_ms)
        if stores:
            commit["stores"] = stores
        if outcome.status == "skipped":
            commit["error"] = _describe(outcome.error)
            commit["skipped"] = info.ranges
        return self._write_checkpoint(
            info,
            retries,
            "writing its commit marker",
            lambda: checkpoint.write_commit(info.batch_time_ms, commit, self.fence),
        )

    def _prune(self, time_ms: int) -> None:
        """Drop the log entries and state checkpoints no restart can need any more."""
        assert self._checkpoint is not None
        keep_from = self._graph.log_needed_from(time_ms)
        if keep_from is not None:
            self._checkpoint.prune_after_commit(
                keep_from, self._graph.state_paths_in_force(), self._graph.state_run_dir, self.fence
            )

    def wait_for_batch(self, time_ms: int, timeout_s: float) -> BatchInfo:
        """Block until the batch at time_ms has completed (tests and the CLI use it)."""
        with self._completed:
            done = self._completed.wait_for(
                lambda: any(i.batch_time_ms >= time_ms for i in self.history), timeout_s
            )
        if not done:
            raise TimeoutError(f"batch {time_ms} did not complete within {timeout_s} s")
        return next(i for i in self.history if i.batch_time_ms >= time_ms)
