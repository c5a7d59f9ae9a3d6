"""Spark's own queue_stream.py example, run unchanged but for its import, on both engines."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parent.parent / "examples" / "pyspark_streaming" / "queue_stream.py"
PYSPARK_IMPORT = "from pyspark.streaming import StreamingContext"


def run_program(path: Path) -> list[list[str]]:
    """Run the program; its pprint output as a list of batches of record lines."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    batches = re.split(r"-+\nTime: [^\n]+\n-+\n", done.stdout)[1:]
    return [[line for line in batch.splitlines() if line] for batch in batches]


@pytest.mark.slow
def test_queue_stream_example_gives_the_same_batches(tmp_path):
    ours = run_program(EXAMPLE)
    original = tmp_path / "queue_stream_pyspark.py"
    source = EXAMPLE.read_text()
    ported_line = next(line for line in source.splitlines() if line.startswith("from dstream"))
    original.write_text(source.replace(ported_line, PYSPARK_IMPORT))
    theirs = run_program(original)

    expected = sorted(f"({digit}, 100)" for digit in range(10))
    for batches in (ours, theirs):
        full = [sorted(batch) for batch in batches if batch]
        assert len(full) >= 3
        assert all(batch == expected for batch in full)
