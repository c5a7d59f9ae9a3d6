"""saveAsTextFiles seen by a program that lists its output directory while batches are written,
as Spark's own streaming tests do (they read the newest entry of `os.listdir`): it must find only
the directories pyspark.streaming creates, and each one it finds must be readable, and whole."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from streams import manual_context, run_batches

BATCHES = 8
PYSPARK_NAME = re.compile(r"words-(\d+)\.txt")


class Lister(threading.Thread):
    """Lists `directory` over and over until stopped; every entry it sees must be named as
    pyspark.streaming names a batch's directory, and is read with Spark when first seen."""

    def __init__(self, sc, directory: Path, expected: dict[str, list[str]]):
        super().__init__(name="lister", daemon=True)
        self.sc = sc
        self.directory = directory
        self.expected = expected
        self.read: dict[str, list[str]] = {}
        self.problems: list[str] = []
        self.passes = 0
        self._stop_listing = threading.Event()

    def run(self) -> None:
        while not self._stop_listing.wait(0.001):
            self.look()
        self.look()

    def stop(self) -> None:
        self._stop_listing.set()
        self.join()

    def look(self) -> None:
        self.passes += 1
        for name in sorted(os.listdir(self.directory)):
            if not PYSPARK_NAME.fullmatch(name):
                self.problems.append(f"{name}: pyspark.streaming creates no such entry")
            elif name not in self.read:
                self.read_whole(name)

    def read_whole(self, name: str) -> None:
        path = self.directory / name
        try:
            finished = "_SUCCESS" in os.listdir(path)
            lines = sorted(self.sc.textFile(str(path)).collect())
        except Exception as error:  # noqa: BLE001 - what the lister saw is the finding
            self.problems.append(f"{name}: cannot be read: {type(error).__name__}: {error}")
            return
        if not finished or lines != self.expected[name]:
            self.problems.append(f"{name}: seen before it was whole ({len(lines)} lines)")
        self.read[name] = lines


def test_a_program_listing_the_output_sees_only_whole_batch_directories(sc, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    batches = [[f"{n}-{i:03}" for i in range(200)] for n in range(BATCHES)]
    expected = {f"words-{(n + 1) * 1000}.txt": batch for n, batch in enumerate(batches)}
    ssc = manual_context(sc)
    ssc.queueStream(batches).repartition(4).saveAsTextFiles(str(out / "words"), "txt")

    lister = Lister(sc, out, expected)
    lister.start()
    run_batches(ssc, BATCHES)
    lister.stop()

    assert lister.problems == []
    assert lister.read == expected
    assert lister.passes > BATCHES
