"""A class-data-sharing archive of Spark's classes, so that the JVMs of a restarted driver and of
its executors start sooner.

A JVM that starts Spark reads, parses and verifies several thousand classes from Spark's jars
before the SparkContext is up, and an executor's JVM most of them again, all on the restart path
of a lost driver (docs/fault-tolerance.md, "The restart path without a standby"). Java 17 can
keep those classes, parsed and verified, in an archive: a JVM run with
`-XX:ArchiveClassesAtExit=FILE` writes every class it loaded into FILE when it exits, and later
JVMs given `-XX:SharedArchiveFile=FILE` map it instead of loading the classes again.

The archive is made once per installation, by `python -m dstream.service.jvm_archive` (`make
setup` runs it for the project's virtualenv, the image's build for the image), and lives beside
that installation (`<sys.prefix>/share/dstream/spark-classes.jsa`), because the JVM records the
path, size and time of every jar it took classes from, and maps the archive only for a class
path that begins with those same jars, in the same order. It comes from a run in local mode,
where the driver's JVM also runs the tasks, so that one archive holds the classes of both roles,
and then, in the same JVM, from a SparkContext with a Kubernetes master, for a driver pod's own;
`spark_conf` gives it to the driver and to the executors (the same jars, on the same machine or
in the same image), with Spark's jars listed one by one at the head of their class paths
(`class_path`). A JVM that cannot use it (the jars or the JDK changed since) starts as it would
without it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from dstream.service import executor_owner

# Where to find the archive instead of the installation's own (empty: use none).
ENV = "DSTREAM_JVM_ARCHIVE"
JAVA_OPTIONS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")
CLASS_PATHS = ("spark.driver.extraClassPath", "spark.executor.extraClassPath")
DUMP_TIMEOUT_S = 600.0
POD_TIMEOUT_S = 120.0
# The Kubernetes client honours HTTP_PROXY; the stand-in API server is on loopback.
NO_PROXY_OPTION = "-Dno.proxy=127.0.0.1"


def default_path() -> Path:
    return Path(sys.prefix) / "share" / "dstream" / "spark-classes.jsa"


def archive_path() -> Path | None:
    """The archive this installation's JVMs use: DSTREAM_JVM_ARCHIVE's if set (empty: none),
    else the installation's own; None when there is no such file."""
    configured = os.environ.get(ENV)
    path = default_path() if configured is None else Path(configured) if configured else None
    return path if path is not None and path.is_file() else None


def class_path() -> str:
    """Spark's jars one by one, sorted: the head of the class path of the JVM that makes the
    archive and of every JVM given it. A JVM maps the archive only if its class path begins with
    the dump's, entry by entry. Spark's own `jars/*` is expanded by the java launcher in the
    order the directory lists its files, which the file system decides (an image built on one
    machine lists them in another order on a node), so it is no such head; and on Kubernetes
    the executors get the driver's extraClassPath (as SPARK_CLASSPATH) at the head of theirs."""
    from pyspark.find_spark_home import _find_spark_home

    jars = Path(_find_spark_home()) / "jars"
    return os.pathsep.join(str(jar) for jar in sorted(jars.glob("*.jar")))


def with_archive(settings: dict[str, str]) -> dict[str, str]:
    """`settings` with the archive added to the driver's and the executors' JVM options (after
    any the job sets) and its class path put before theirs (a job's own jars come after
    Spark's), when there is one."""
    path = archive_path()
    if path is None:
        return settings
    option = f"-XX:SharedArchiveFile={path}"
    added = {key: f"{settings.get(key, '')} {option}".strip() for key in JAVA_OPTIONS}
    head = class_path()
    added |= {key: os.pathsep.join(filter(None, (head, settings.get(key)))) for key in CLASS_PATHS}
    return {**settings, **added}


# -- making the archive -----------------------------------------------------------------------


def build(path: Path) -> Path:
    """Make the archive at `path`: a run of Spark's usual work in a child process whose JVM
    writes the archive when it exits (a half-written file never takes `path`'s place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-m", "dstream.service.jvm_archive", "--dump-run", str(partial)],
        check=True,
        timeout=DUMP_TIMEOUT_S,
    )
    wait_for_exit_of_jvms_writing(partial, DUMP_TIMEOUT_S)
    if not partial.is_file() or partial.stat().st_size == 0:
        raise RuntimeError(f"the JVM wrote no class archive at {partial}")
    partial.replace(path)
    return path


def wait_for_exit_of_jvms_writing(partial: Path, timeout_s: float) -> None:
    """Wait until no process names `partial` on its command line: the dump run's JVM outlives
    its Python process by the time it takes to see its stdin close and write the archive."""
    deadline = time.monotonic() + timeout_s
    while any(str(partial).encode() in cmdline for cmdline in command_lines()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"a JVM still writes {partial} after {timeout_s:.0f} s")
        time.sleep(0.2)


def command_lines() -> list[bytes]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes())
            except OSError:  # the process ended meanwhile
                continue
    return lines


def dump_run(partial: Path) -> None:
    """The work whose classes the archive keeps: a SparkContext in local mode (driver and tasks
    in one JVM) running a stateful batch's kinds of jobs, as the standby's warm-up does, and a
    state checkpoint written and read back, as a restart's recovery does; then Spark's
    Kubernetes backend (load_kubernetes_backend)."""
    from pyspark import SparkConf, SparkContext

    from dstream.runtime.leadership.follower import warm_up
    from dstream.runtime.scheduling import pools
    from dstream.worker import pydaemon

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = SparkConf().setAll([*pydaemon.SPARK_CONF.items(), *pools.SPARK_CONF.items()])
    conf.setMaster("local[2]").setAppName("dstream-jvm-archive")
    # -Xlog: the dump lists every class it cannot keep (hundreds of generated ones) as a warning
    conf.set(
        "spark.driver.extraJavaOptions",
        f"-XX:ArchiveClassesAtExit={partial} -Xlog:cds*=error {NO_PROXY_OPTION}",
    )
    conf.set("spark.driver.extraClassPath", class_path())
    conf.set("spark.ui.showConsoleProgress", "false")
    sc = SparkContext(conf=conf)
    with tempfile.TemporaryDirectory(prefix="dstream-jvm-archive-") as scratch:
        sc.setCheckpointDir(scratch)
        warm_up(sc, threading.Event(), rounds=2)
        state = sc.parallelize([(n % 7, n) for n in range(100)], 2).reduceByKey(max)
        state.checkpoint()
        state.count()
        path = state.getCheckpointFile()
        assert path is not None
        sc._jsc.checkpointFile(path).count()
        lines = Path(scratch) / "input.txt"
        lines.write_text("a line of input\n" * 100)
        sc.textFile(str(lines)).map(str.split).count()
    sc.stop()
    load_kubernetes_backend()


def load_kubernetes_backend() -> None:
    """A SparkContext with a Kubernetes master, in the dump run's JVM, until its executor
    allocator has made a pod from a template, as the operator's drivers do. A driver in a pod
    loads some two thousand classes that a local one never does (Spark's Kubernetes backend,
    the fabric8 client and its model of Kubernetes' objects, vert.x, a YAML parser for the
    template), between its JVM's start and its request for executors, on a restart's path.
    The API server is a stand-in on loopback (api_server_stand_in); no pod runs."""
    from pyspark import SparkConf, SparkContext

    with (
        api_server_stand_in() as (url, pod_made),
        tempfile.TemporaryDirectory(prefix="dstream-jvm-archive-") as scratch,
    ):
        template = Path(scratch) / "executor-pod-template.yaml"
        template.write_text(yaml.safe_dump(EXECUTOR_POD_TEMPLATE))  # as executor_owner writes it
        conf = SparkConf().setMaster(f"k8s://{url}").setAppName("dstream-jvm-archive")
        conf.setAll(list(KUBERNETES_DUMP_SETTINGS.items()))
        conf.set("spark.kubernetes.executor.podTemplateFile", str(template))
        sc = SparkContext(conf=conf)
        try:
            if not pod_made.wait(POD_TIMEOUT_S):
                raise RuntimeError("Spark's Kubernetes backend never made an executor pod")
            # A watch reads its events as objects of any kind, which loads the client's classes
            # for every kind; the stand-in has no watch (a websocket), so one is read here.
            serialization = sc._jvm.io.fabric8.kubernetes.client.utils.Serialization
            serialization.unmarshal(json.dumps(EXECUTOR_POD_TEMPLATE))
        finally:
            sc.stop()


KUBERNETES_DUMP_SETTINGS = {
    "spark.kubernetes.namespace": "dstream-jvm-archive",
    "spark.kubernetes.container.image": "dstream-jvm-archive",
    "spark.kubernetes.executor.disableConfigMap": "true",  # as the operator's drivers
    "spark.kubernetes.executor.enableApiWatcher": "false",  # a watch is a websocket
    "spark.kubernetes.executor.podTemplateContainerName": "executor",
    "spark.executor.instances": "1",
    "spark.scheduler.minRegisteredResourcesRatio": "0",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.log.level": "OFF",  # the stand-in's refusals, logged as errors
}
# As the operator's template, with the owner a driver pod adds.
EXECUTOR_POD_TEMPLATE = executor_owner.with_owner(
    {
        "metadata": {
            "labels": {"dstream.dev/job": "dstream-jvm-archive", "dstream.dev/role": "executor"}
        },
        "spec": {"containers": [{"name": "executor", "resources": {"requests": {"cpu": "100m"}}}]},
    },
    pod="driver",
    uid="0",
)
NOT_FOUND = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404}
NO_PODS = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}


@contextlib.contextmanager
def api_server_stand_in() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP server on a free loopback port that makes every pod it is sent (answers it back),
    lists none and finds nothing else; its URL, and an event set once a pod was made."""
    pod_made = threading.Event()

    class StandIn(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            pods = self.path.split("?")[0].endswith("/pods")
            if pods and self.command == "POST":
                self.send(201, body)
                pod_made.set()
            elif pods and self.command == "GET":
                self.send(200, json.dumps(NO_PODS).encode())
            else:
                self.send(404, json.dumps(NOT_FOUND).encode())

        def send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pod_made
    finally:
        server.shutdown()
        server.server_close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dstream.service.jvm_archive", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output", type=Path, default=default_path(), help="archive file")
    parser.add_argument("--dump-run", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.dump_run is not None:
        dump_run(args.dump_run)
        return 0
    started = time.monotonic()
    build(args.output)
    size_mb = args.output.stat().st_size / 2**20
    print(f"{args.output}: {size_mb:.0f} MB, made in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
