"""dstream's Python worker daemon: Spark starts it, it reads a task's bytes unchanged with Nagle's
algorithm off, and its workers' garbage collections skip long-lived objects (see dstream.worker.pydaemon
for what each removes from every task)."""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import types

import pytest
from dstream.worker import pydaemon


def _parent_command(_partition):
    with open(f"/proc/{os.getppid()}/cmdline") as cmdline:
        return [cmdline.read().replace("\0", " ")]


@pytest.mark.skipif(not os.path.exists("/proc/self/cmdline"), reason="needs /proc (Linux)")
def test_spark_runs_tasks_under_the_dstream_daemon(sc):
    """The session's SparkContext has dstream's settings, as `dstream run` has."""
    assert sc.getConf().get("spark.python.daemon.module") == "dstream.worker.pydaemon"
    parents = sc.parallelize(range(4), 4).mapPartitions(_parent_command).collect()
    assert all("-m dstream.worker.pydaemon" in command for command in parents), parents
    assert sc.parallelize(range(1000), 4).map(lambda x: x * 2).sum() == 999_000


def _pyspark_file(_partition):
    import pyspark

    return [pyspark.__file__]


def test_workers_import_pyspark_from_the_installed_package_not_sparks_zip(sc):
    """Spark puts its pyspark.zip first on the workers' path; the daemon imports the installed
    package instead (compiled once, not at every daemon start): the same files, as SPARK_HOME is
    that package here."""
    import pyspark

    files = sc.parallelize(range(2), 2).mapPartitions(_pyspark_file).collect()
    assert files == [pyspark.__file__] * 2, files


def test_sparks_zips_go_last_only_when_they_are_the_installed_pyspark_s_own():
    import pyspark

    package = os.path.dirname(pyspark.__file__)
    site = os.path.dirname(package)
    lib = os.path.join(package, "python", "lib")
    zips = [os.path.join(lib, "pyspark.zip"), os.path.join(lib, "py4j-0.10.9.9-src.zip")]
    assert pydaemon.prefer_installed_pyspark([*zips, "/app", site]) == ["/app", site, *zips]
    elsewhere = ["/opt/spark/python/lib/pyspark.zip", "/opt/spark/python/lib/py4j-src.zip", site]
    assert pydaemon.prefer_installed_pyspark(elsewhere) == elsewhere  # another Spark: its zips
    without_install = [*zips, "/app"]
    assert pydaemon.prefer_installed_pyspark(without_install) == without_install
    assert pydaemon.prefer_installed_pyspark(["/app", site]) == ["/app", site]


def _collected_objects(_partition):
    gc.collect()
    return [(os.getpid(), len(gc.get_objects()), gc.get_freeze_count())]


def test_workers_collect_only_what_tasks_made(sc):
    """After a task, a worker's garbage collection walks a few hundred objects, not the tens of
    thousands of modules and caches it got from the daemon (frozen before the fork). The first
    run of `_collected_objects` in a cold worker imports this module (and pytest with it): the
    worker freezes those after that task, so only a worker that ran it before is measured. Spark
    forks a cold worker whenever its idle ones are busy, so the rounds go on until four warm
    measures are in."""
    measure = sc.parallelize(range(4), 4).mapPartitions(_collected_objects)
    ran_before: set[int] = set()
    warm: list[tuple[int, int]] = []
    for _ in range(10):
        results = measure.collect()
        warm += [(tracked, frozen) for pid, tracked, frozen in results if pid in ran_before]
        ran_before |= {pid for pid, _, _ in results}
        if len(warm) >= 4:
            break
    assert len(warm) >= 4, f"workers never ran the measure twice: {sorted(ran_before)}"
    for tracked, frozen in warm:
        assert frozen > 30_000, frozen
        assert tracked < 5_000, tracked


def test_a_task_that_imported_modules_is_frozen_after_it(monkeypatch):
    """What a task imports stays for the worker's life: main freezes it once the task ends."""
    from pyspark import worker

    def task_importing_a_module(infile, outfile):
        module = types.ModuleType("dstream_test_imported")
        module.cycle = [module]
        sys.modules["dstream_test_imported"] = module

    monkeypatch.setattr(worker, "main", task_importing_a_module)
    monkeypatch.delitem(sys.modules, "dstream_test_imported", raising=False)
    gc.unfreeze()
    try:
        _run_task()
        assert not any(o is sys.modules["dstream_test_imported"] for o in gc.get_objects())
        made_after_the_freeze = [[]]
        _run_task()  # imports nothing new
        assert any(o is made_after_the_freeze for o in gc.get_objects()), "froze again"
    finally:
        gc.unfreeze()


def _run_task() -> None:
    with open(os.devnull, "rb") as infile, open(os.devnull, "wb") as outfile:
        pydaemon.main(infile, outfile)


@pytest.fixture
def tcp_pair():
    """A connected loopback TCP pair, as the daemon's worker and the JVM have."""
    listener = socket.create_server(("127.0.0.1", 0))
    jvm = socket.create_connection(listener.getsockname())
    worker_side, _ = listener.accept()
    listener.close()
    yield worker_side, jvm
    worker_side.close()
    jvm.close()


@pytest.mark.skipif(pydaemon.QUICKACK is None, reason="TCP_QUICKACK is Linux-only")
def test_worker_main_reads_every_byte_with_nagle_off(tcp_pair, monkeypatch):
    """A command followed by data in separate writes (as the JVM sends a task) reaches
    PySpark's worker whole, through the re-arming reader, on a socket with TCP_NODELAY."""
    worker_side, jvm = tcp_pair
    assert worker_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
    command, data = b"c" * 4368, b"d" * 70_000 + b"end"
    received: list[bytes] = []

    def pyspark_worker_main(infile, outfile):
        received.append(infile.read(len(command) + len(data)))
        outfile.write(b"done")

    from pyspark import worker

    monkeypatch.setattr(worker, "main", pyspark_worker_main)
    sender = threading.Thread(target=lambda: (jvm.sendall(command), jvm.sendall(data)))
    sender.start()
    infile = os.fdopen(os.dup(worker_side.fileno()), "rb", 65536)
    outfile = os.fdopen(os.dup(worker_side.fileno()), "wb", 65536)
    try:
        pydaemon.main(infile, outfile)
        outfile.flush()
    finally:
        sender.join()
        infile.close()
        outfile.close()
    assert received == [command + data]
    assert jvm.recv(4) == b"done"
    assert worker_side.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
