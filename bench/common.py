"""What every benchmark shares: where results and logs go, the input's seed and record shape
(dstream's own line generator, loaded on its own), the engines compared, the Spark settings of
every measured process, and how such a process is started in its own process group, stopped
with it, and reports its events.

The sub-packages (throughput, recovery, backpressure) import this module and `bench.machine`,
never the other way round.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark import SparkConf

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
LOGS = ROOT / "bench" / "logs"
WORKER_MODULES = ROOT / "driver" / "dstream" / "worker"

# Every system reads the same lines: dstream.worker.textgen's pool of RECORD_BYTES-byte lines
# for SEED, spread over PARTITIONS input partitions.
SEED = 7
RECORD_BYTES = 100
PARTITIONS = 2

ENGINES = ("dstream", "pyspark.streaming")  # the two DStream engines compared
DAEMONS = ("dstream.worker.pydaemon", "pyspark.daemon")  # the Python worker daemons measured


def load_textgen() -> ModuleType:
    """dstream.worker.textgen loaded on its own, not through the dstream package: importing the
    engine changes how a Python worker runs its tasks (dstream.worker.zipcache), and the peers'
    workers must stay as their users have them. textgen itself imports only the standard
    library."""
    module = sys.modules.get("bench_textgen")
    if module is None:
        spec = importlib.util.spec_from_file_location(
            "bench_textgen", WORKER_MODULES / "textgen.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_textgen"] = module
        spec.loader.exec_module(module)
    return module


textgen = load_textgen()


def spark_conf(master: str, partitions: int, daemon: str) -> SparkConf:
    """The same Spark settings for every system: local, `partitions` tasks per stage, and the
    Python worker daemon under test. Python workers run this interpreter (the venv, where
    dstream and bench import): PySpark reads PYSPARK_PYTHON when the SparkContext starts, and
    PYTHONPATH reaches the workers. Nothing is taken from a JVM already running in this process
    (a test's SparkContext)."""
    from dstream.worker import pydaemon
    from pyspark import SparkConf

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    settings = [
        ("spark.master", master),
        ("spark.app.name", "dstream-bench"),
        ("spark.ui.enabled", "false"),
        ("spark.ui.showConsoleProgress", "false"),
        ("spark.driver.host", "127.0.0.1"),
        ("spark.driver.bindAddress", "127.0.0.1"),
        ("spark.default.parallelism", str(partitions)),
        ("spark.sql.shuffle.partitions", str(partitions)),
        ("spark.driver.memory", "2g"),
    ]
    if daemon == "dstream.worker.pydaemon":
        settings += list(pydaemon.SPARK_CONF.items())
    elif daemon != "pyspark.daemon":
        raise ValueError(f"unknown worker daemon {daemon!r} (one of {DAEMONS})")
    return SparkConf(loadDefaults=False).setAll(settings)


def start_process(command: list[str], log_name: str, stdin: bool = False) -> subprocess.Popen[str]:
    """`command` from the repository's root in a process group of its own (its JVM and Python
    workers join it), stdout piped for its JSON events, stderr to bench/logs/<log_name>."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with open(LOGS / log_name, "w") as log:
        return subprocess.Popen(
            command,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            start_new_session=True,
        )


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the process's whole group (driver, JVM, Python workers) and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


_EMITTING = threading.Lock()


def emit(**fields: Any) -> None:
    """One event of a measured process, a JSON line on stdout for the process that started it.
    Whole lines only: a batch listener and a kill thread emit at once (print writes the line
    and its newline apart, and a line cut that way stopped a recovery run)."""
    line = json.dumps(fields) + "\n"
    with _EMITTING:
        sys.stdout.write(line)
        sys.stdout.flush()


def run_tool(package: str, tools: dict[str, str], argv: list[str] | None = None) -> int:
    """`python -m bench.<package> <tool> [options]`: the `main(options)` of the module that
    `tools` names for <tool>, imported only then (one tool's --help loads no other's Spark)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in tools:
        names = ", ".join(tools)
        print(f"usage: python -m bench.{package} {{{names}}} [options]  (TOOL -h for its own)")
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(f"bench.{package}.{tools[args[0]]}")
    sys.argv[0] = f"python -m bench.{package} {args[0]}"  # argparse's program name
    return module.main(args[1:]) or 0
