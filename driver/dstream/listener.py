"""StreamingListener: the base class pyspark.streaming programs subclass, with the same hooks."""

from __future__ import annotations

from typing import Any


class StreamingListener:
    """Override any of these; each receives an event whose batchInfo() describes the batch."""

    def onStreamingStarted(self, streamingStarted: Any) -> None:
        """Called when the streaming has been started."""

    def onBatchSubmitted(self, batchSubmitted: Any) -> None:
        """Called when a batch's input is planned and the batch is queued."""

    def onBatchStarted(self, batchStarted: Any) -> None:
        """Called when processing of a batch has started."""

    def onBatchCompleted(self, batchCompleted: Any) -> None:
        """Called when a batch has completed (successfully or with an error)."""

    def onOutputOperationStarted(self, outputOperationStarted: Any) -> None:
        """Kept for source compatibility; the engine reports per batch."""

    def onOutputOperationCompleted(self, outputOperationCompleted: Any) -> None:
        """Kept for source compatibility; the engine reports per batch."""
