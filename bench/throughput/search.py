"""Searching for the maximum sustainable rate, one trial at a time.

The search is a state machine (`RateSearch`) so that the orchestrator can interleave the
searches of several systems, one trial of each in turn. Processing time grows about linearly
with the batch's records (p = a + b * rate), and a trial measures p even when the rate is not
sustainable, so each next rate is where the line through the trials' p90 processing times
predicts TARGET_MS (just under the pass limit: the search looks for the edge), kept
inside the bracket (highest passing rate, lowest failing rate above it). When the lowest failing
rate failed with its batches in time (on latency, or a feed that lagged), the line says nothing
about that edge, and when the last two trials both failed, it has missed it twice: then the
bracket's geometric middle is tried instead. When the bracket is
narrow enough, or the trials are used up, the highest passing rate must pass a confirmation
trial (longer, with the window full); a failed confirmation steps down by STEP_DOWN (not below
the highest passing search rate that has not failed a confirmation) and confirms again. The
result is a confirmed rate or none at all: there is no fallback figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.throughput.trial import BUSY, INTERVAL_MS, WRONG, Verdict

TARGET_MS = 0.95 * INTERVAL_MS
MIN_RATE = 100
STEP_DOWN = 0.85  # after a failed confirmation


@dataclass
class Trial:
    rate: int
    confirmation: bool
    verdict: Verdict


@dataclass
class SearchResult:
    """`rate` is set only when it passed a confirmation trial (or, in a search without
    confirmations, a search trial; such a result is labelled unconfirmed by its caller)."""

    status: str  # "confirmed", "passed search", "no passing rate", "wrong output", "machine busy"
    rate: int | None
    trials: list[Trial] = field(default_factory=list)


def round_rate(rate: float) -> int:
    """Two significant digits, so trial rates read well in the results."""
    digits = max(0, int(math.log10(max(rate, 1))) - 1)
    return max(MIN_RATE, int(round(rate, -digits)))


def predict(trials: list[Trial], target_ms: float = TARGET_MS) -> float | None:
    """The rate at which the least-squares line through the trials' p90 processing time
    reaches target_ms; None without two distinct rates or with a flat or falling line."""
    points = [(t.rate, t.verdict.processing_p90_ms) for t in trials if t.verdict.batches]
    if len({r for r, _ in points}) < 2:
        return None
    mean_r = sum(r for r, _ in points) / len(points)
    mean_p = sum(p for _, p in points) / len(points)
    spread = sum((r - mean_r) ** 2 for r, _ in points)
    slope = sum((r - mean_r) * (p - mean_p) for r, p in points) / spread
    if slope <= 0:
        return None
    return mean_r + (target_ms - mean_p) / slope


class RateSearch:
    """`next_trial()` says what to run next ((rate, confirmation) or None when done);
    `record()` takes its verdict."""

    def __init__(
        self,
        start: int,
        max_trials: int,
        tolerance: float,
        confirm: bool,
        max_confirmations: int = 3,
        interval_ms: int = INTERVAL_MS,
    ):
        self.start = start
        self.target_ms = TARGET_MS * interval_ms / INTERVAL_MS
        self.max_trials = max_trials
        self.tolerance = tolerance
        self.confirm = confirm
        self.max_confirmations = max_confirmations
        self.trials: list[Trial] = []
        self.result: SearchResult | None = None

    def _search_trials(self) -> list[Trial]:
        return [t for t in self.trials if not t.confirmation]

    def bracket(self) -> tuple[int | None, int | None]:
        """(highest passing rate, lowest failing rate above it) of the search and the failed
        confirmations (a rate that failed confirmation is a failing rate)."""
        passed = [t.rate for t in self._search_trials() if t.verdict.sustainable]
        failed = [t.rate for t in self.trials if not t.verdict.sustainable]
        confirmed_failed = {
            t.rate for t in self.trials if t.confirmation and not t.verdict.sustainable
        }
        passed = [r for r in passed if r not in confirmed_failed]
        low = max(passed) if passed else None
        above = [r for r in failed if low is None or r > low]
        return low, (min(above) if above else None)

    def next_trial(self) -> tuple[int, bool] | None:
        if self.result is not None:
            return None
        if not self.trials:
            return self.start, False
        last = self.trials[-1]
        if last.verdict.kind in (WRONG, BUSY):
            return self._finish(last.verdict.kind, None)
        if last.confirmation and last.verdict.sustainable:
            return self._finish("confirmed", last.rate)
        low, high = self.bracket()
        if last.confirmation:
            confirmations = sum(t.confirmation for t in self.trials)
            if confirmations >= self.max_confirmations:
                return self._finish("no passing rate", None)
            below = round_rate(last.rate * STEP_DOWN)
            return (max(low, below), True) if low is not None else self._confirm_or_stop(below)
        narrow = low is not None and high is not None and high / low <= 1 + self.tolerance
        used_up = len(self._search_trials()) >= self.max_trials
        if narrow or used_up:
            if low is None:
                return self._finish("no passing rate", None)
            if not self.confirm:
                return self._finish("passed search", low)
            return low, True
        rate = self._next_search_rate(low, high, last.rate)
        if rate is None or rate in (low, high):
            return (low, True) if low and self.confirm else self._finish_search(low)
        return rate, False

    def _confirm_or_stop(self, rate: int) -> tuple[int, bool] | None:
        if rate <= MIN_RATE and any(t.rate <= MIN_RATE for t in self.trials):
            return self._finish("no passing rate", None)
        return rate, True

    def _finish_search(self, low: int | None) -> None:
        if low is None:
            return self._finish("no passing rate", None)
        return self._finish("passed search", low)

    def _finish(self, status: str, rate: int | None) -> None:
        self.result = SearchResult(status, rate, self.trials)
        return None

    def _failed_within_time(self, rate: int) -> bool:
        """Whether a search trial at this rate failed although its batches ran in time (on
        latency, a lagging feed): the processing-time line then cannot place the edge."""
        return any(
            t.rate == rate
            and not t.verdict.sustainable
            and t.verdict.batches
            and t.verdict.processing_p90_ms < self.target_ms
            for t in self._search_trials()
        )

    def _next_search_rate(self, low: int | None, high: int | None, last: int) -> int | None:
        """Inside the bracket: the line's prediction, else (when the lowest failing rate
        failed for another reason than processing time, or the last two trials both failed)
        the bracket's geometric middle; without a failing rate yet at most 4x up, without a
        passing one at least 4x down. Near an edge where processing time does not grow
        linearly, the line can keep placing it just below the last failure."""
        if low is None and high is not None and high <= MIN_RATE:
            return None
        lower = low * (1 + self.tolerance / 2) if low else last / 4
        upper = high / (1 + self.tolerance / 2) if high else last * 4
        missed = [t.verdict.sustainable for t in self._search_trials()[-2:]] == [False, False]
        blind = high is not None and (missed or self._failed_within_time(high))
        guess = None if blind else predict(self.trials, self.target_ms)
        if guess is None:
            guess = math.sqrt(lower * upper) if low and high else (upper if not high else lower)
        return round_rate(min(max(guess, lower), upper))

    def record(self, rate: int, confirmation: bool, verdict: Verdict) -> None:
        self.trials.append(Trial(rate, confirmation, verdict))
