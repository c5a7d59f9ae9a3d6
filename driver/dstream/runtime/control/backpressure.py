"""Backpressure: Spark's PID rate estimator and the controller that applies it to every source.

After each batch the estimator turns (records, processing time, scheduling delay) into the rate
the next batch may admit; the controller decides which batches the estimator learns from and
converts the rate into a record budget per batch.

Spark's law reads every batch as a measure of the job's capacity. Some batches are not one, and
read as one they cut the limit of a job that has capacity to spare, from where it climbs back
slowly (a small batch's fixed cost makes it measure a low rate). The departures from Spark, each
so that only a batch that says how fast the job processes moves the limit down
(docs/backpressure.md has the reasons and the measurements):

- Bounded steps: an update moves the rate by at most a factor of `max_step` (2 by default) from
  the last estimate. A batch slowed by something else (an interactive query, a garbage
  collection, a lost executor) measures a processing rate far below what the job sustains;
  Spark's law would follow it down and, with the scheduling delay that batch caused, often to
  minRate. Bounded, one such batch halves the rate at worst and the next normal batch restores
  it, while a real overload still halves the rate every batch until it fits.
- Warm-up: a process's first batch with records, and the ones after it that overrun the
  interval (WARMUP_BATCHES in all at most), are not measured: they pay for the JVM's compiler,
  the Python workers and cold caches, not for their records.
- Only limited batches: a batch that admitted everything available (its budget held nothing
  back) ran below the job's capacity; it neither lowers nor raises the limit, so a quiet source
  does not drag the limit down to its own rate. (A job without any limit yet learns from a batch
  that overran, which is how its first limit comes.)
- After a quiet spell: the first limited batch after one that was not, if it kept up, raises the
  limit at once to the best processing rate of recent limited batches, instead of doubling it
  batch by batch.
- An initialRate above the first measured processing rate comes down to it at once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

log = logging.getLogger(__name__)
SLOW_AT_FLOOR_BATCHES = 3  # batches over the interval at minRate before the warning
WARMUP_BATCHES = 3  # a process's first batches with records left unmeasured, at most
CAPACITY_BATCHES = 20  # limited batches whose best processing rate a quiet spell may jump to


@dataclass(frozen=True)
class PidTerms:
    """The terms of the last update, exported as metrics."""

    processing_rate: float
    error: float
    historical_error: float
    derivative_error: float
    rate: float


class PIDRateEstimator:
    """Spark's PIDRateEstimator: the same control law, defaults and update rules; each step
    bounded by `max_step` (see the module docstring)."""

    def __init__(
        self,
        batch_interval_ms: int,
        proportional: float = 1.0,
        integral: float = 0.2,
        derivative: float = 0.0,
        min_rate: float = 100.0,
        max_step: float = 2.0,
    ):
        if batch_interval_ms <= 0:
            raise ValueError(f"batch interval must be positive, got {batch_interval_ms} ms")
        for label, gain in (
            ("proportional", proportional),
            ("integral", integral),
            ("derivative", derivative),
        ):
            if gain < 0:
                raise ValueError(f"{label} gain must be >= 0, got {gain}")
        if min_rate <= 0:
            raise ValueError(f"minRate must be > 0, got {min_rate}")
        if max_step <= 1:
            raise ValueError(f"maxStep must be > 1, got {max_step}")
        self.batch_interval_ms = batch_interval_ms
        self.proportional = proportional
        self.integral = integral
        self.derivative = derivative
        self.min_rate = min_rate
        self.max_step = max_step
        self._first_run = True
        self._latest_time = -1
        self._latest_rate = -1.0
        self._latest_error = -1.0
        self.last_terms: PidTerms | None = None

    @property
    def primed(self) -> bool:
        """Whether a valid update has recorded a processing rate (Spark's first run is over)."""
        return not self._first_run

    @property
    def latest_rate(self) -> float:
        """The last estimate, or after the first valid update the processing rate it measured."""
        return self._latest_rate

    def rebase(self, rate: float) -> None:
        """Take `rate` as the last estimate: a rule outside the PID law moved the limit, and the
        next step is bounded from where the limit is, not from where the law had put it."""
        self._latest_rate = rate

    def compute(
        self, time_ms: int, records: int, processing_ms: int, scheduling_ms: int
    ) -> float | None:
        """The new rate in records/second, or None when this batch gives no (first) estimate."""
        if time_ms <= self._latest_time or records <= 0 or processing_ms <= 0:
            return None
        since_update_s = (time_ms - self._latest_time) / 1000
        processing_rate = records / processing_ms * 1000
        error = self._latest_rate - processing_rate
        historical_error = scheduling_ms * processing_rate / self.batch_interval_ms
        derivative_error = (error - self._latest_error) / since_update_s
        pid_rate = (
            self._latest_rate
            - self.proportional * error
            - self.integral * historical_error
            - self.derivative * derivative_error
        )
        bounded = min(
            max(pid_rate, self._latest_rate / self.max_step), self._latest_rate * self.max_step
        )
        new_rate = max(bounded, self.min_rate)
        self._latest_time = time_ms
        if self._first_run:
            self._latest_rate = processing_rate
            self._latest_error = 0.0
            self._first_run = False
            return None
        self._latest_rate = new_rate
        self._latest_error = error
        self.last_terms = PidTerms(
            processing_rate, error, historical_error, derivative_error, new_rate
        )
        return new_rate


class RateController:
    """Holds one source's current rate limit, turns it into the next batch's record budget, and
    decides which batches the estimator learns from (see the module docstring)."""

    def __init__(
        self,
        estimator: PIDRateEstimator,
        initial_rate: float | None = None,
        max_rate: float | None = None,
    ):
        self.estimator = estimator
        self.max_rate = max_rate
        self._rate = self._capped(initial_rate)
        self._warmup_left = WARMUP_BATCHES
        self._after_unlimited = False
        self._limited_rates: deque[float] = deque(maxlen=CAPACITY_BATCHES)
        self._slow_at_floor = 0
        self._lock = threading.Lock()

    def _capped(self, rate: float | None) -> float | None:
        if self.max_rate is None:
            return rate
        return self.max_rate if rate is None else min(rate, self.max_rate)

    @property
    def rate_limit(self) -> float | None:
        """Records per second the next batch may admit (None: unlimited)."""
        return self._rate

    @property
    def capacity(self) -> float | None:
        """The best processing rate of the last CAPACITY_BATCHES measured limited batches."""
        return max(self._limited_rates, default=None)

    def max_records(self) -> int | None:
        """The next batch's budget: the rate limit times the batch interval."""
        rate = self._rate
        if rate is None:
            return None
        return max(1, int(rate * self.estimator.batch_interval_ms / 1000))

    def update(
        self,
        time_ms: int,
        records: int,
        processing_ms: int,
        scheduling_ms: int,
        *,
        limited: bool,
    ) -> None:
        """Learn from a completed batch. `limited`: its budget held back records that were
        available, so it ran at the limit; one that was not limited admitted everything."""
        with self._lock:
            if self._learns_from(records, processing_ms, limited):
                self._measure(time_ms, records, processing_ms, scheduling_ms, limited)
            self._after_unlimited = not limited
            self._watch_floor(records, processing_ms)

    def _kept_up(self, processing_ms: int) -> bool:
        return processing_ms <= self.estimator.batch_interval_ms

    def _learns_from(self, records: int, processing_ms: int, limited: bool) -> bool:
        """Whether the batch says how fast the job processes: not while the process warms up;
        a limited batch does; an unlimited one ran below capacity, except while there is no
        limit at all: then one that overran the interval is how the first limit comes."""
        if records > 0 and self._warming_up(self._kept_up(processing_ms)):
            return False
        return limited or (self._rate is None and not self._kept_up(processing_ms))

    def _warming_up(self, kept_up: bool) -> bool:
        """Whether this batch with records is still part of the process's warm-up: the first
        one, and each later one that overran the interval until WARMUP_BATCHES were seen. A
        batch that kept up ends the warm-up (it is measured): the job is warm enough to tell."""
        if self._warmup_left == 0:
            return False
        if self._warmup_left == WARMUP_BATCHES or not kept_up:
            self._warmup_left -= 1
            return True
        self._warmup_left = 0
        return False

    def _measure(
        self,
        time_ms: int,
        records: int,
        processing_ms: int,
        scheduling_ms: int,
        limited: bool,
    ) -> None:
        """Apply the estimator's new rate. Spark's first valid update only records the
        processing rate, which leaves an initialRate set far too high in force for one more
        overloaded batch; here a limit above that first measurement comes down to it at once.
        The first limited batch after one that was not (a burst after a quiet spell), if it
        kept up, lifts the limit to the recent capacity in one step."""
        primed = self.estimator.primed
        new_rate = self.estimator.compute(time_ms, records, processing_ms, scheduling_ms)
        if new_rate is None and not primed and self.estimator.primed and self._rate is not None:
            new_rate = min(self._rate, self.estimator.latest_rate)
        if limited and records > 0 and processing_ms > 0:
            self._limited_rates.append(records / processing_ms * 1000)
            if self._after_unlimited and self._kept_up(processing_ms) and new_rate is not None:
                new_rate = self._at_least_capacity(new_rate)
        if new_rate is not None:
            self._rate = self._capped(new_rate)

    def _at_least_capacity(self, rate: float) -> float:
        """The rate, or the recent capacity if that is higher (the estimator steps from it)."""
        capacity = self.capacity
        if capacity is None or capacity <= rate:
            return rate
        self.estimator.rebase(capacity)
        return capacity

    def _watch_floor(self, records: int, processing_ms: int) -> None:
        """Warn once per episode when batches overrun the interval although the limit sits at
        minRate: then a batch's fixed cost, not its records, is what is too slow, and no rate
        limit can help; the user must lengthen the interval or give the job more cores."""
        interval_ms = self.estimator.batch_interval_ms
        at_floor = self._rate is not None and self._rate <= self.estimator.min_rate
        if not (at_floor and processing_ms > interval_ms):
            self._slow_at_floor = 0
            return
        self._slow_at_floor += 1
        if self._slow_at_floor == SLOW_AT_FLOOR_BATCHES:
            log.warning(
                "%d batches in a row took longer than the %.1f s interval at the rate floor "
                "(minRate %g records/s; the last: %d records in %.1f s): the fixed cost of a "
                "batch exceeds the interval, so backpressure cannot keep up; lengthen the "
                "batch interval (batchInterval) or give the job more executor cores",
                SLOW_AT_FLOOR_BATCHES,
                interval_ms / 1000,
                self.estimator.min_rate,
                records,
                processing_ms / 1000,
            )
