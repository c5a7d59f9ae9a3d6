"""A ported program whose Python workers lack dstream still runs: the StreamingContext ships the
package to them (dstream.shipping), as PySpark ships pyspark.zip. The workers' interpreter here
is a bare virtualenv of the same Python, with neither pyspark nor dstream installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections import Counter
from pathlib import Path

import pytest
from running_driver import QUICK_JIT

PROGRAM = Path(__file__).parents[1] / "programs" / "keyed_operators.py"
BATCHES = [["a", "b", "a"], ["b", "c"], ["a", "c", "c"], ["d"]]


def window_counts(i: int) -> Counter:
    return Counter(BATCHES[i]) + (Counter(BATCHES[i - 1]) if i else Counter())


def expected() -> dict[str, list[list]]:
    per_batch = [Counter(batch) for batch in BATCHES]
    windows = [window_counts(i) for i in range(len(BATCHES))]
    return {
        "reduceByKey": [sorted(c.items()) for c in per_batch],
        "countByValue": [sorted(c.items()) for c in per_batch],
        "combineByKey": [sorted((k, [1] * n) for k, n in c.items()) for c in per_batch],
        "countByWindow": [[sum(c.values())] for c in windows],
        "countByValueAndWindow": [sorted(c.items()) for c in windows],
        "groupByKeyAndWindow": [sorted((k, [1] * n) for k, n in c.items()) for c in windows],
        "reduceByKeyAndWindow": [sorted(c.items()) for c in windows],
        # With an inverse function a key whose count fell to 0 stays (the test drops those).
        "reduceByKeyAndWindow-inverse": [sorted(c.items()) for c in windows],
    }


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A Python 3.11 with nothing installed: no pyspark, no dstream."""
    home = tmp_path_factory.mktemp("bare-python")
    venv.EnvBuilder(with_pip=False).create(home)
    python = str(home / "bin" / "python")
    probe = "import importlib.util as u; print(u.find_spec('dstream'), u.find_spec('pyspark'))"
    assert subprocess.run([python, "-c", probe], capture_output=True, text=True).stdout.split() == [
        "None",
        "None",
    ]
    return python


@pytest.mark.slow
def test_keyed_and_windowed_operators_run_on_workers_without_dstream(bare_python, tmp_path):
    """The program's JVMs run the quick JIT only, as the tests' drivers do (a run of seconds
    never pays back the optimizing compiler's work)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYSPARK_PYTHON=bare_python, SPARK_LOCAL_IP="127.0.0.1", JAVA_TOOL_OPTIONS=QUICK_JIT)
    done = subprocess.run(
        [sys.executable, str(PROGRAM), str(tmp_path / "checkpoint")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    outputs = {name: batches[: len(BATCHES)] for name, batches in printed.items()}
    inverse = outputs.pop("reduceByKeyAndWindow-inverse")
    want = expected()
    want_inverse = want.pop("reduceByKeyAndWindow-inverse")
    assert {name: as_tuples(batches) for name, batches in outputs.items()} == {
        name: as_tuples(batches) for name, batches in want.items()
    }
    assert [[r for r in batch if r[1]] for batch in as_tuples(inverse)] == want_inverse


def as_tuples(batches: list[list]) -> list[list]:
    """JSON's lists back into the pairs they were (a count stays as it is)."""
    return [[tuple(r) if isinstance(r, list) else r for r in batch] for batch in batches]
