"""The files source across restarts, and bad input: exactly the new files, each once (text files
and binaryRecordsStream's fixed-length records alike), malformed JSON lines counted and set aside
with their file and line while the batch goes on, and a binary file cut short refused by name."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from dstream import StreamingContext
from dstream.runtime.scheduling.clock import ManualClock
from dstream.runtime.timeutil import time_to_ms
from dstream.sources import SourceError
from streams import final_failure

BATCH_TIMEOUT_S = 120


class FileJob:
    """textFileStream, fileStream or binaryRecordsStream (with a record length) on a manual
    clock; output keyed by batch time (idempotent)."""

    def __init__(
        self, sc: Any, root: Path, format: str | None = None, record_length: int | None = None
    ):
        self.sc = sc
        self.directory = root / "in"
        self.directory.mkdir(parents=True)
        self.checkpoint = str(root / "checkpoint")
        self.format = format
        self.record_length = record_length
        self.output: dict[int, list[Any]] = {}
        self.now_ms = 0
        self.source: Any = None

    def setup(self) -> StreamingContext:
        ssc = StreamingContext(self.sc, 1, clock=ManualClock(self.now_ms))
        if self.record_length is not None:
            self.source = ssc.binaryRecordsStream(str(self.directory), self.record_length)
        elif self.format is None:
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

    def add(self, name: str, text: str | bytes) -> None:
        """Write under a hidden name and rename into place, as writers should."""
        hidden = self.directory / f".{name}"
        hidden.write_bytes(text if isinstance(text, bytes) else text.encode())
        hidden.rename(self.directory / name)

    def add_records(self, name: str, records: list[str]) -> None:
        """A file of these records: text lines, or (with a record length) fixed-length records
        back to back."""
        if self.record_length is None:
            self.add(name, "".join(f"{record}\n" for record in records))
        else:
            assert all(len(record) == self.record_length for record in records)
            self.add(name, "".join(records).encode())

    def records(self, *records: str) -> list[Any]:
        """What the job's output holds for these records: lines, or bytes."""
        return [record.encode() if self.record_length else record for record in records]

    def run(self, ssc: StreamingContext, batches: int = 1) -> None:
        for _ in range(batches):
            self.now_ms += 1000
            ssc._clock.advance(1000)
            ssc._scheduler.wait_for_batch(self.now_ms, BATCH_TIMEOUT_S)


@pytest.mark.parametrize("record_length", [None, 2], ids=["textFileStream", "binaryRecordsStream"])
def test_a_file_stream_reads_each_new_file_once_across_restarts(sc, tmp_path, record_length):
    job = FileJob(sc, tmp_path, record_length=record_length)
    job.add_records("a", ["a1"])  # present before the first start: skipped
    ssc = job.start()
    job.add_records("b", ["b1", "b2"])
    job.run(ssc)
    job.add_records("c", ["c1"])
    job.now_ms += 1000
    ssc._clock.advance(1000)  # planned (and logged); it may or may not run before the stop
    while not (Path(job.checkpoint) / "log" / f"batch-{job.now_ms}.json").exists():
        pass
    ssc.stop(stopSparkContext=False)
    job.add_records("d", ["d1", "d2", "d3"])  # arrived while the driver was down

    ssc = job.start()
    job.run(ssc)
    job.add_records("e", ["e1"])
    job.run(ssc)
    ssc.stop(stopSparkContext=False)

    assert job.output == {
        1000: job.records("b1", "b2"),
        2000: job.records("c1"),
        3000: job.records("d1", "d2", "d3"),
        4000: job.records("e1"),
    }


def test_a_binary_file_cut_short_stops_the_run_naming_it_and_loses_nothing(sc, tmp_path):
    """pyspark.streaming fails the batch (an EOFException from Spark's reader) and goes on
    without the file; here the batch is refused before anything of it is logged, and the
    restart reads the file once it is whole."""
    job = FileJob(sc, tmp_path, record_length=4)
    ssc = job.start()
    job.add("a", b"abcdefgh")
    job.run(ssc)
    job.add("b", b"ijklm")
    job.now_ms += 1000
    ssc._clock.advance(1000)
    failed = final_failure(ssc)
    ssc.stop(stopSparkContext=False)
    assert isinstance(failed.__cause__, SourceError)
    assert str(failed.__cause__) == (
        f"binaryRecordsStream: {job.directory / 'b'} has 5 bytes, not a multiple of "
        "recordLength 4: its last record would be cut short (1 of 4 bytes). Fix or remove the "
        "file (write files under a hidden name and rename them into place)"
    )
    assert not (Path(job.checkpoint) / "log" / "batch-2000.json").exists()

    job.add("b", b"ijklmnop")
    job.now_ms -= 1000
    ssc = job.start()
    job.run(ssc)
    ssc.stop(stopSparkContext=False)
    assert job.output == {1000: [b"abcd", b"efgh"], 2000: [b"ijkl", b"mnop"]}


def test_binary_records_are_cut_on_record_boundaries_and_read_once(tmp_path):
    """A file larger than a core's share is read in ranges that start on a record, so each
    record is read once, whole, however many ranges there are."""
    from dstream.sources import MIN_RANGE_BYTES, _records_in_range, byte_ranges

    path = tmp_path / "records"
    records = [f"{n:07}".encode() for n in range(3 * MIN_RANGE_BYTES // 7)]
    path.write_bytes(b"".join(records))
    for cores in (1, 2, 3, 5):
        ranges = byte_ranges([str(path)], cores, align=7)
        assert all(start % 7 == 0 for _path, start, _end in ranges)
        assert [r for item in ranges for r in _records_in_range(item, 7)] == records


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
