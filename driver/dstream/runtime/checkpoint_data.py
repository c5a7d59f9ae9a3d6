"""What checkpointing one stream's RDDs needs to know, held by the stream (as Spark's
DStreamCheckpointData) and set only through its methods: the streams that carry state (state,
reduced windows) call `require`, a reduced window calls `keep_durable` on its parent, the graph
and recovery record the checkpoints in force with `keep`, and the graph, the scheduler and
recovery read the result instead of attributes set on other objects.
"""

from __future__ import annotations


class CheckpointData:
    """One stream's checkpoint needs: whether it must be checkpointed (it carries state from
    batch to batch), how many of its batches are written durably and kept (a reduced window
    subtracts them after a restart), how many hash partitions its restored RDDs have, and its
    checkpoints in force (the newest it keeps, which pruning must leave in place)."""

    def __init__(self) -> None:
        self._required = False
        self._durable_batches = 0
        self._partitions: int | None = None
        self._in_force: list[tuple[int, str]] = []

    def __getstate__(self) -> dict[str, object]:
        """Pickled with the graph, without the checkpoints in force: a restarted driver finds
        those in the batch log, not in the graph it pickled at its start."""
        return {**self.__dict__, "_in_force": []}

    def require(self, partitions: int) -> None:
        """The stream carries state: it is checkpointed at its interval (10 s by default) and a
        restored checkpoint gets back its hash partitioner over `partitions`."""
        self._required = True
        self._partitions = partitions

    def keep_durable(self, batches: int, partitions: int) -> None:
        """A reduced window subtracts this stream's batches: write each one durably and keep
        the newest `batches` (the most any window over it asks for); they are reduced by key
        into `partitions`, which a restored one gets back as its partitioner."""
        self._durable_batches = max(self._durable_batches, batches)
        self._partitions = partitions

    @property
    def required(self) -> bool:
        """Whether the stream must have a state checkpoint to be recovered exactly."""
        return self._required

    @property
    def durable_batches(self) -> int:
        """How many of its newest batches are written durably and kept (0: none)."""
        return self._durable_batches

    @property
    def partitions(self) -> int | None:
        """The hash partition count of its RDDs, when checkpointing depends on it."""
        return self._partitions

    @property
    def in_force(self) -> tuple[tuple[int, str], ...]:
        """(batch time, path) of its checkpoints in force, oldest first."""
        return tuple(self._in_force)

    def keep(self, time_ms: int, path: str) -> None:
        """A checkpoint of the stream is complete: it is in force, and the oldest beyond
        `checkpoints_kept()` no longer are."""
        self._in_force.append((time_ms, path))
        del self._in_force[: -self.checkpoints_kept()]

    def checkpoints_kept(self) -> int:
        """How many of its newest checkpoints stay in force: two for state (if the newest is
        torn, the older serves), or every batch a restarted window may still subtract."""
        return max(2, self._durable_batches)
