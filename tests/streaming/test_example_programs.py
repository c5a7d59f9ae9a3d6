"""The example programs in examples/programs run unchanged on dstream and on pyspark.streaming,
with the same output, each with PATH reduced to /usr/bin:/bin (the examples must find Java and
their Python on their own, as on a bare machine).

Each finite example prints its first BATCHES batches (pprint) or its store's content; the
recoverable one is run, stopped and restarted, and its store compared once all input is in.
"""

from __future__ import annotations

import importlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from conditions import eventually
from running_driver import QUICK_JIT

PROGRAMS = Path(__file__).parents[2] / "examples" / "programs"
FINITE = [
    "queue_stream",
    "stateful_wordcount",
    "windowed_counts",
    "transform_join",
    "foreachrdd_sqlite",
]
ENGINES = ("dstream", "pyspark")
BARE_PATH = "/usr/bin:/bin"
TIMEOUT_S = 900  # two JVMs at once on a loaded 2-core machine
HEADER = re.compile(r"-+\nTime: [^\n]+\n-+\n")


def bare_environment(engine: str) -> dict[str, str]:
    """This environment with a bare PATH and no PYSPARK_PYTHON: the program picks its Python.
    Its JVMs (Spark's launcher and the driver) run the quick JIT only, as the tests' drivers do
    (running_driver.QUICK_JIT): a minute-long run never pays back the optimizing compiler's work
    (windowed_counts on pyspark.streaming: 41 CPU seconds with it, 28 without)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    return {
        **env,
        "PATH": BARE_PATH,
        "STREAMING_ENGINE": engine,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "JAVA_TOOL_OPTIONS": QUICK_JIT,
    }


@contextmanager
def started(
    program: str, engine: str, args: list[str], stderr: Any = subprocess.PIPE
) -> Iterator[subprocess.Popen[str]]:
    """The program in a process group of its own, which is killed on the way out (the program,
    its JVM and Python workers), whether the test passed or not."""
    process = subprocess.Popen(
        [sys.executable, str(PROGRAMS / f"{program}.py"), *args],
        env=bare_environment(engine),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def batches_of(program: str) -> int:
    """The example's BATCHES (importing it runs nothing: its work is under __main__)."""
    sys.path.insert(0, str(PROGRAMS))
    try:
        return importlib.import_module(program).BATCHES
    finally:
        sys.path.remove(str(PROGRAMS))


def normalized(stdout: str, batches: int) -> list[Any]:
    """pprint output: the first `batches` batches, each as its sorted lines (batch times are
    the wall clock's, so they differ); any other output: its lines."""
    blocks = HEADER.split(stdout)
    if len(blocks) == 1:
        return stdout.splitlines()
    return [sorted(line for line in block.splitlines() if line) for block in blocks[1:]][:batches]


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.parametrize("program", FINITE)
def test_an_example_gives_the_same_output_on_both_engines_with_a_bare_path(program, tmp_path):
    args = {"foreachrdd_sqlite": lambda e: [str(tmp_path / f"{e}.db")]}.get(program, lambda e: [])
    outputs = {}
    with ExitStack() as stack:
        running = {e: stack.enter_context(started(program, e, args(e))) for e in ENGINES}
        for engine, process in running.items():
            stdout, stderr = process.communicate(timeout=TIMEOUT_S)
            assert process.returncode == 0, f"{engine}: {stderr[-3000:]}"
            outputs[engine] = normalized(stdout, batches_of(program))

    assert outputs["dstream"] == outputs["pyspark"]
    if HEADER.search(stdout):
        assert len(outputs["dstream"]) == batches_of(program)
    assert any(outputs["dstream"]), "no output at all"


class Run:
    """One run of the recoverable example, its stdout read line by line as it comes."""

    def __init__(self, process: subprocess.Popen[str], stderr: Path):
        self.process = process
        self.stderr = stderr
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """`eventually`, ended at once if the program exits first."""

        def while_running() -> bool:
            assert self.process.poll() is None, f"exited before {what}: {self.errors()}"
            return condition()

        eventually(while_running, TIMEOUT_S, interval=0.1, message=what)

    def stop(self) -> None:
        """SIGTERM, which the program answers with a stop (the batches it did not finish are
        the next run's: a graceful stop would wait for the whole backlog of a slow machine)."""
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(TIMEOUT_S) == 0, self.errors()
        self._reader.join(TIMEOUT_S)

    def errors(self) -> str:
        return self.stderr.read_text(errors="replace")[-3000:]


def totals(database: Path) -> Counter[str]:
    """Waits for the lock as long as the program's own writers do (30 s): on a loaded machine a
    batch's writer can hold it past sqlite's default of 5 s while the test reads."""
    with sqlite3.connect(database, timeout=30) as db:
        return Counter(dict(db.execute("SELECT word, n FROM totals").fetchall()))


def add_file(directory: Path, name: str, text: str) -> None:
    hidden = directory / f".{name}"
    hidden.write_text(text)
    hidden.rename(directory / name)


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("engine", ENGINES)
def test_the_recoverable_example_restarts_without_calling_setup(engine, tmp_path):
    program = "recoverable_wordcount"
    inputs, database = tmp_path / "in", tmp_path / "totals.db"
    inputs.mkdir()
    args = [str(inputs), str(tmp_path / "checkpoint"), str(database)]
    texts = ["to be or not to be", "to stream or not to stream, that is the question"]
    expected: Counter[str] = Counter()
    setups = []
    for number, text in enumerate(texts):
        stderr = tmp_path / f"run-{number}.err"
        with stderr.open("w") as errors, started(program, engine, args, errors) as process:
            run = Run(process, stderr)
            run.wait_for(lambda r=run: any(x.startswith("streaming") for x in r.lines), "start")
            add_file(inputs, f"part-{number}.txt", text)
            expected.update(text.split())
            run.wait_for(lambda: database.exists() and totals(database) == expected, "totals")
            run.stop()
        setups.append(sum("building the streaming program" in line for line in run.lines))

    assert setups == [1, 0]
    assert totals(database) == expected
