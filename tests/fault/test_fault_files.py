"""The files source across restarts, and bad input: exactly the new files, each once, and
malformed JSON lines counted and set aside with their file and line while the batch goes on."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from dstream import StreamingContext
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.timeutil import time_to_ms

BATCH_TIMEOUT_S = 120


class FileJob:
    """textFileStream/fileStream on a manual clock; output keyed by batch time (idempotent)."""

    def __init__(self, sc: Any, root: Path, format: str | None = None):
        self.sc = sc
        self.directory = root / "in"
        self.directory.mkdir(parents=True)
        self.checkpoint = str(root / "checkpoint")
        self.format = format
        self.output: dict[int, list[Any]] = {}
        self.now_ms = 0
        self.source: Any = None

    def setup(self) -> StreamingContext:
        ssc = StreamingContext(self.sc, 1, clock=ManualClock(self.now_ms))
        if self.format is None:
            self.source = ssc.textFileStream(str(self.directory))
        else:
            self.source = ssc.fileStream(str(self.directory), self.format)

        output = self.output  # not `self`, which holds the SparkContext: the graph is pickled

        def keep(time: datetime, rdd: Any) -> None:
            output[time_to_ms(time)] = sorted(rdd.collect(), key=str)

        self.source.foreachRDD(keep)
        return ssc

    def start(self) -> StreamingContext:
        """A restart runs setup again (rebuild), so `keep` fills this job's `output`."""
        ssc = StreamingContext.getOrCreate(self.checkpoint, self.setup, rebuild=True)
        ssc.start()
        return ssc

    def add(self, name: str, text: str) -> None:
        """Write under a hidden name and rename into place, as writers should."""
        hidden = self.directory / f".{name}"
        hidden.write_text(text)
        hidden.rename(self.directory / name)

    def run(self, ssc: StreamingContext, batches: int = 1) -> None:
        for _ in range(batches):
            self.now_ms += 1000
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(self.now_ms, BATCH_TIMEOUT_S)


def test_text_file_stream_reads_each_new_file_once_across_restarts(sc, tmp_path):
    job = FileJob(sc, tmp_path)
    job.add("a.txt", "present before the first start\n")
    ssc = job.start()
    job.add("b.txt", "b1\nb2\n")
    job.run(ssc)
    job.add("c.txt", "c1\n")
    job.now_ms += 1000
    ssc._clock.advance(1000)  # planned (and logged); it may or may not run before the stop
    while not (Path(job.checkpoint) / "log" / f"batch-{job.now_ms}.json").exists():
        pass
    ssc.stop(stopSparkContext=False)
    job.add("d.txt", "arrived while the driver was down\n")

    ssc = job.start()
    job.run(ssc)
    job.add("e.txt", "e1\n")
    job.run(ssc)
    ssc.stop(stopSparkContext=False)

    assert job.output == {
        1000: ["b1", "b2"],
        2000: ["c1"],
        3000: ["arrived while the driver was down"],
        4000: ["e1"],
    }


def test_malformed_json_lines_go_to_the_dead_letter_directory(sc, tmp_path):
    job = FileJob(sc, tmp_path, format="json")
    ssc = job.start()
    job.add("events.jsonl", '{"user": "a"}\n{"user": \n{"user": "b"}\nnot json\n\n{"user": "c"}\n')
    job.run(ssc)
    ssc.stop(stopSparkContext=False)

    assert job.output[1000] == [{"user": "a"}, {"user": "b"}, {"user": "c"}]
    assert job.source.malformed_records == 2
    assert ssc._scheduler.history[-1].error is None
    dead = Path(job.checkpoint) / "deadletter" / "batch-1000" / "events.jsonl.jsonl"
    entries = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [(Path(e["file"]).name, e["line"], e["record"]) for e in entries] == [
        ("events.jsonl", 2, '{"user": '),
        ("events.jsonl", 4, "not json"),
    ]


def text_mode_lines(path: Path) -> list[str]:
    """What a whole file reads as in Python's text mode, the line ends removed."""
    with open(path, encoding="utf-8", errors="replace") as lines:
        return [line.rstrip("\n") for line in lines]


def test_byte_ranges_read_every_line_once_wherever_the_cuts_fall(tmp_path):
    """A text file is read in byte ranges (so one large file uses every core); each line goes to
    the range holding its first byte, including \\r\\n and lone \\r line ends, multi-byte
    characters and a last line without an end."""
    from dstream.sources import _lines_in_range

    path = tmp_path / "mixed.txt"
    path.write_bytes(
        "first\nsecond\r\nthird\rfourth\n\n¿ñandú?\r\r\nlast".encode() + b"\xff bad byte\n"
    )
    expected = text_mode_lines(path)
    size = path.stat().st_size
    for first in range(size + 1):
        for second in range(first, size + 1):
            cuts = [0, first, second, size]
            read = [
                line
                for start, end in zip(cuts, cuts[1:], strict=False)
                for line in _lines_in_range((str(path), start, end))
            ]
            assert read == expected, (first, second)


def test_a_batch_of_fewer_large_files_than_cores_is_cut_into_a_range_per_core(tmp_path):
    from dstream.sources import MIN_RANGE_BYTES, byte_ranges

    big, small = tmp_path / "big", tmp_path / "small"
    big.write_bytes(b"x" * (4 * MIN_RANGE_BYTES - 1) + b"\n")
    small.write_bytes(b"y\n")
    assert byte_ranges([str(big)], 2) == [
        (str(big), 0, 2 * MIN_RANGE_BYTES),
        (str(big), 2 * MIN_RANGE_BYTES, 4 * MIN_RANGE_BYTES),
    ]
    many = byte_ranges([str(big)] * 4 + [str(small)], 2)
    assert len(many) == 5  # enough files for the cores: one range each
    assert byte_ranges([str(small)], 8) == [(str(small), 0, 2)]
