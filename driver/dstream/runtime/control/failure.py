"""What the scheduler does with a batch whose output failed: the failure policy.

pyspark.streaming commits a failed batch and moves on, so its output is gone for good. Here a
failed output operation runs again after a backoff, as does a batch record or commit marker
that the checkpoint's storage refuses (read-only, full), and when the retries are spent the
driver stops with the batch uncommitted: a restart (the operator's or the user's) runs it again
with the same input. Skipping a batch is possible only when asked for (`onExhausted: skip`),
and only for its outputs; the skip is recorded with the batch's input ranges and counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ON_EXHAUSTED = ("stop", "skip")


class BatchFailedError(RuntimeError):
    """A batch failed for good (its output after every retry, or its planning); the run stops
    without committing it. Its `__cause__` is the batch's own error. Any other error that
    awaitTermination raises is one failed attempt, and the run goes on."""


@dataclass(frozen=True)
class FailurePolicy:
    retries: int = 5
    backoff_s: float = 1.0
    on_exhausted: str = "stop"

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"failurePolicy.retries must be >= 0, got {self.retries}")
        if self.backoff_s <= 0:
            raise ValueError(f"failurePolicy.backoffSeconds must be > 0, got {self.backoff_s}")
        if self.on_exhausted not in ON_EXHAUSTED:
            raise ValueError(
                f"failurePolicy.onExhausted must be one of {ON_EXHAUSTED}, "
                f"got {self.on_exhausted!r}"
            )

    @classmethod
    def from_conf(cls, conf: Any) -> FailurePolicy:
        """From `spark.dstream.failurePolicy.*` (the job spec's failurePolicy sets them)."""
        prefix = "spark.dstream.failurePolicy."
        return cls(
            retries=int(conf.get(prefix + "retries", str(cls.retries))),
            backoff_s=float(conf.get(prefix + "backoffSeconds", str(cls.backoff_s))),
            on_exhausted=conf.get(prefix + "onExhausted", cls.on_exhausted),
        )

    @property
    def skips(self) -> bool:
        return self.on_exhausted == "skip"

    def backoff_before(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1, 2, ...): doubling from backoff_s."""
        return self.backoff_s * 2 ** (retry - 1)
