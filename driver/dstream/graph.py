"""The DStream graph: every stream in definition order, its inputs and outputs, and zero time.

Definition order gives each stream a stable index, which is how a restarted program's streams are
matched with the state checkpoints of the previous run (the signature must agree).
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import RDD

if TYPE_CHECKING:
    from dstream.dstream import DStream, OutputDStream
    from dstream.sources import InputDStream


class DStreamGraph:
    def __init__(self, batch_ms: int):
        self.batch_ms = batch_ms
        self.zero_ms = 0
        self.streams: list[DStream] = []
        self.inputs: list[InputDStream] = []
        self.outputs: list[OutputDStream] = []
        self.remember_ms = 0
        self.checkpoint_path: Path | None = None
        self._deadletter_fallback: Path | None = None
        self._marked: dict[int, tuple[DStream, RDD, int]] = {}
        self.in_force: dict[int, list[tuple[int, str]]] = {}
        self.coalesced: set[int] = set()  # batch times merged into a later batch (scheduler.py)
        self._lock = threading.Lock()

    def add_stream(self, stream: DStream) -> int:
        self.streams.append(stream)
        return len(self.streams) - 1

    def add_input(self, stream: InputDStream) -> None:
        if any(existing.name == stream.name for existing in self.inputs):
            stream.name = f"{stream.name}-{len(self.inputs)}"
        self.inputs.append(stream)

    def add_output(self, stream: OutputDStream) -> None:
        self.outputs.append(stream)

    def signature(self) -> list[dict[str, Any]]:
        return [s.signature() for s in self.streams]

    def stateful_streams(self) -> list[DStream]:
        return [s for s in self.streams if s._checkpoint_ms]

    def start(self, zero_ms: int) -> None:
        """Fix zero time, checkpoint intervals and remember spans; called once before batch 1."""
        if not self.outputs:
            raise ValueError("No output operations registered, so nothing to execute")
        self.zero_ms = zero_ms
        for stream in self.streams:
            stream._initialize()
        for output in self.outputs:
            output._remember(max(self.remember_ms, self.batch_ms))

    def max_remember_ms(self) -> int:
        return max((s._remember_ms for s in self.streams), default=self.batch_ms)

    def coalesce(self, times: list[int]) -> None:
        """These batch times are not batches: no stream has an RDD for them, and stateful
        streams step from the last batch that ran (DStream._previous_time)."""
        self.coalesced.update(times)

    def clear_metadata(self, time_ms: int) -> None:
        for stream in self.streams:
            stream._clear_metadata(time_ms)
        horizon = time_ms - self.max_remember_ms()
        for source in self.inputs:
            source.forget_before(horizon)
        self.coalesced = {t for t in self.coalesced if t >= horizon}

    # -- state checkpoints --------------------------------------------------------------

    def mark_for_checkpoint(self, stream: DStream, rdd: RDD, time_ms: int) -> None:
        """Checkpoint to reliable storage when the job has a checkpoint path, else locally."""
        if self.checkpoint_path is not None:
            rdd.checkpoint()
        else:
            rdd.localCheckpoint()
        with self._lock:
            self._marked[id(rdd)] = (stream, rdd, time_ms)

    def completed_checkpoints(self) -> dict[str, dict[str, Any]]:
        """State checkpoints written since the last call: {stream index: {time, path}}."""
        done: dict[str, dict[str, Any]] = {}
        with self._lock:
            for key, (stream, rdd, time_ms) in list(self._marked.items()):
                if not rdd.isCheckpointed():
                    continue
                del self._marked[key]
                path = rdd.getCheckpointFile()
                if path:
                    done[str(stream._index)] = {"time": time_ms, "path": path}
                    self.keep_checkpoint(stream._index, time_ms, path)
        return done

    def keep_checkpoint(self, index: int, time_ms: int, path: str) -> None:
        """The newest two checkpoints per stream stay: if the newest is torn, the older serves."""
        kept = self.in_force.setdefault(index, [])
        kept.append((time_ms, path))
        del kept[:-2]

    def state_paths_in_force(self) -> set[str]:
        return {path for kept in self.in_force.values() for _time, path in kept}

    def oldest_checkpoint_in_force(self) -> int | None:
        times = [kept[0][0] for kept in self.in_force.values() if kept]
        return min(times) if times else None

    def keeps_checkpoint(self, rdd: RDD) -> bool:
        """Checkpointed RDDs that are still a stream's newest state must stay cached."""
        with self._lock:
            return id(rdd) in self._marked

    def deadletter_dir(self, time_ms: int) -> str:
        """Where malformed records of a batch go (under the checkpoint, else a temp dir)."""
        if self.checkpoint_path is not None:
            base = self.checkpoint_path / "deadletter"
        else:
            if self._deadletter_fallback is None:
                self._deadletter_fallback = Path(tempfile.mkdtemp(prefix="dstream-deadletter-"))
            base = self._deadletter_fallback
        return str(base / f"batch-{time_ms}")
