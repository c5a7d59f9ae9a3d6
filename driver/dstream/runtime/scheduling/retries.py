"""The retries of one batch's steps (its record, its outputs, its commit) under the failure
policy (control/failure.py): they share the policy's count, wait a doubling backoff before each
retry, and end early on a stop or on a failure that no retry can mend.

Each failed attempt reaches awaitTermination at once, as pyspark.streaming reports a failed
batch: programs and supervisors waiting there learn of it while the retries go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dstream.runtime.checkpoint.directory import LogConflictError
from dstream.runtime.control.failure import FailurePolicy
from dstream.runtime.leadership.fencing import DeposedError
from dstream.runtime.scheduling.batch import BatchInfo
from dstream.runtime.timeutil import datetime_of

log = logging.getLogger(__name__)

# Failures that no retry can mend: a newer driver leads (DeposedError), or wrote this batch's
# log entry already (LogConflictError). The run stops at once.
FINAL_FAILURES = (DeposedError, LogConflictError)

Attempt = Callable[[], Exception | None]


class BatchRetries:
    """Runs the steps of the batch `info` (counting its retries in `info.retries`).
    `report_error` receives each failed attempt; `wait_for_stop(seconds)` waits out a backoff
    and says whether a stop came meanwhile."""

    def __init__(
        self,
        info: BatchInfo,
        policy: FailurePolicy,
        report_error: Callable[[BaseException], None],
        wait_for_stop: Callable[[float], bool],
    ):
        self._info = info
        self._policy = policy
        self._report_error = report_error
        self._wait_for_stop = wait_for_stop

    def run(self, step: str, attempt: Attempt) -> Exception | None:
        """Run `attempt` until it returns no failure. The last failure when the retries are
        spent, a stop came first or the failure is final; else None."""
        while (failure := attempt()) is not None:
            self._report_error(failure)
            if isinstance(failure, FINAL_FAILURES):
                return failure
            if self._info.retries == self._policy.retries or not self._back_off(step, failure):
                return failure
            self._info.retries += 1
        return None

    def _back_off(self, step: str, error: Exception) -> bool:
        """Wait before the next retry; False when a stop came first (the batch stays
        uncommitted and runs again after a restart)."""
        retry = self._info.retries + 1
        seconds = self._policy.backoff_before(retry)
        log.warning(
            "batch %s: %s failed (%s); retry %d of %d in %.1f s",
            datetime_of(self._info.batch_time_ms),
            step,
            str(error).splitlines()[0] if str(error) else type(error).__name__,
            retry,
            self._policy.retries,
            seconds,
        )
        return not self._wait_for_stop(seconds)
