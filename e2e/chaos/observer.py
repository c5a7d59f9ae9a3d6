"""Watches a running job from the outside: its checkpoint's batch log and its driver pods.

The engine prunes old log entries, so the observer keeps, for every batch it saw, the input ranges
of its record (`log/batch-<ms>.json`) and when its commit marker (`log/commit-<ms>.json`) was
written; those give the reference input of every committed batch and its delay. It also counts
the job's live driver pods at every poll: more than one at once would be a duplicate driver.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass

from e2e.chaos.cluster import Cluster, pod_alive
from e2e.chaos.storage import Storage

log = logging.getLogger(__name__)

_LOG_FILE = re.compile(r"^(batch|commit)-(\d+)\.json$")
MAX_POLL_FAILURES_IN_A_ROW = 30


@dataclass(frozen=True)
class Snapshot:
    ranges: dict[int, list[list[int]]]  # batch time (ms) -> [start, end) per source partition
    coalesced: dict[int, list[int]]  # batch time (ms) -> earlier due times merged into it
    commits: dict[int, float]  # batch time (ms) -> when its commit marker was written (epoch s)
    max_drivers: int  # most live driver pods seen at once
    epochs: dict[int, int]  # batch time (ms) -> the epoch of the driver that committed it

    def committed_after(self, epoch_s: float) -> list[int]:
        """Batch times whose commit was written after `epoch_s`, oldest commit first."""
        return sorted((t for t, at in self.commits.items() if at > epoch_s), key=self.commits.get)

    def committed_above(self, epoch: int) -> list[int]:
        """Batch times committed by a driver of a newer epoch than `epoch`, oldest commit
        first: a new driver's, not those of an old one still finishing its graceful stop."""
        newer = (t for t, e in self.epochs.items() if e > epoch and t in self.commits)
        return sorted(newer, key=self.commits.get)

    def delay(self, time_ms: int) -> float:
        """Seconds from the batch's time until its output was committed."""
        return self.commits[time_ms] - time_ms / 1000

    def first_on_schedule_after(self, epoch_s: float, limit_s: float) -> int | None:
        """The time (ms) of the first committed batch due after `epoch_s` whose delay is within
        `limit_s`: the job back on schedule."""
        on_time = (t for t in sorted(self.commits) if t / 1000 > epoch_s)
        return next((t for t in on_time if self.delay(t) <= limit_s), None)

    def on_schedule_for_good(
        self, epoch_s: float, until_s: float | None, limit_s: float
    ) -> int | None:
        """The time (ms) of the first batch due after `epoch_s` from which on every batch
        committed before `until_s` (the next fault; None: the end of the observation) ran
        within `limit_s`: back on schedule and staying there, which a batch that ran on time
        before a fault's cost landed does not show."""
        due = [
            t
            for t in sorted(self.commits)
            if t / 1000 > epoch_s and (until_s is None or self.commits[t] < until_s)
        ]
        late = [i for i, t in enumerate(due) if self.delay(t) > limit_s]
        first = late[-1] + 1 if late else 0
        return due[first] if first < len(due) else None

    def waits_for_schedule(
        self, times: list[int], limit_s: float, step_s: float = 0.1
    ) -> list[float]:
        """For moments every `step_s` between the first and last of `times` (consecutive
        fault-free batches): the seconds from the moment until the job is on schedule
        (`first_on_schedule_after`). It is what "back on schedule" measures when nothing
        failed, about half an interval plus a batch's delay: what a fault's figure is to be
        read against."""
        waits = []
        moment, last = min(times) / 1000, max(times) / 1000
        while moment < last:
            due = self.first_on_schedule_after(moment, limit_s)
            if due is None:
                break
            waits.append(self.commits[due] - moment)
            moment += step_s
        return waits


class Observer(threading.Thread):
    def __init__(
        self, storage: Storage, cluster: Cluster, namespace: str, job: str, every_s: float
    ):
        super().__init__(name="observer", daemon=True)
        self.storage, self.cluster = storage, cluster
        self.namespace, self.job, self.every_s = namespace, job, every_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._ranges: dict[int, list[list[int]]] = {}
        self._coalesced: dict[int, list[int]] = {}
        self._commits: dict[int, float] = {}
        self._epochs: dict[int, int] = {}
        self._max_drivers = 0
        self._failures_in_a_row = 0
        self.failure: str | None = None  # why the observer gave up, if it did

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.poll()
                self._failures_in_a_row = 0
            except Exception as error:  # a flaky read must not end the observation
                self._failures_in_a_row += 1
                log.warning(
                    "observer poll failed (%d in a row): %r", self._failures_in_a_row, error
                )
                if self._failures_in_a_row >= MAX_POLL_FAILURES_IN_A_ROW:
                    self.failure = f"{self._failures_in_a_row} polls failed in a row: {error!r}"
                    return
            self._stopping.wait(self.every_s)

    def poll(self) -> None:
        entries = self.storage.log_entries()
        drivers = self.cluster.job_pods(self.namespace, self.job, "driver")
        live_drivers = sum(1 for pod in drivers if pod_alive(pod))
        with self._lock:
            self._max_drivers = max(self._max_drivers, live_drivers)
            for name, entry in entries.items():
                match = _LOG_FILE.match(name)
                if not match:
                    continue
                kind, time_ms = match.group(1), int(match.group(2))
                if kind == "commit":
                    body = _record_body(entry.data)
                    if body is not None and time_ms not in self._commits:
                        self._commits[time_ms] = entry.mtime
                        self._epochs[time_ms] = body.get("epoch", 0)
                elif time_ms not in self._ranges:
                    body = _record_body(entry.data)
                    if body is not None:
                        (self._ranges[time_ms],) = body["ranges"].values()  # the job's one source
                        self._coalesced[time_ms] = body.get("coalesced", [])

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                dict(self._ranges),
                dict(self._coalesced),
                dict(self._commits),
                self._max_drivers,
                dict(self._epochs),
            )

    def stop(self, timeout_s: float = 30) -> None:
        self._stopping.set()
        self.join(timeout_s)


def _record_body(data: bytes) -> dict | None:
    """A log entry's body (a record's input ranges and coalesced times, a commit's epoch); None
    while the file is torn."""
    try:
        return json.loads(data)["body"]
    except (ValueError, KeyError):
        return None
