"""The checkpoint directory's housekeeping, without Spark: pruning, crashed writers' leftovers,
signatures, the fault-injection hook, and the files sink's staging and replacement of an earlier
attempt."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dstream.runtime.checkpoint.directory import CheckpointDir, compare_signatures
from dstream.runtime.checkpoint.files import write_document
from dstream.runtime.checkpoint.output import (
    is_mount_point,
    remove_earlier_attempts,
    replace_directory,
    staging_dir,
)
from fault.harness import bind_mount, tmpfs


def spark_checkpoint(run: Path, rdd: int, in_flight: bool = False) -> Path:
    """A directory shaped like Spark's reliable checkpoint of one RDD (Hadoop .crc included)."""
    directory = run / f"rdd-{rdd}"
    directory.mkdir(parents=True)
    (directory / "part-00000").write_bytes(b"x")
    (directory / ".part-00000.crc").write_bytes(b"c")
    if in_flight:
        (directory / ".part-00001-attempt-0").write_bytes(b"")
    return directory


def test_prune_drops_old_entries_and_checkpoints_not_in_force(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    for time_ms in (1000, 2000, 3000):
        checkpoint.write_batch(time_ms, {"ranges": {}})
        checkpoint.write_commit(time_ms, {"state": {}})
    old_run, this_run = checkpoint.state_dir / "old-run", checkpoint.state_dir / "this-run"
    kept = spark_checkpoint(old_run, 1)
    finished_elsewhere = spark_checkpoint(old_run, 2, in_flight=True)  # its writer is dead
    superseded = spark_checkpoint(this_run, 3)
    being_written = spark_checkpoint(this_run, 4, in_flight=True)
    empty_old_run = checkpoint.state_dir / "older-run"
    empty_old_run.mkdir()
    an_hour_ago = time.time() - 3600
    os.utime(empty_old_run, (an_hour_ago, an_hour_ago))
    starting_run = checkpoint.state_dir / "starting-run"  # a standby's, just made by Spark
    starting_run.mkdir()

    checkpoint.prune(2000, {f"file:{kept}"}, f"file:{this_run}")

    assert sorted(p.name for p in checkpoint.log_dir.iterdir()) == [
        "batch-2000.json",
        "batch-3000.json",
        "commit-2000.json",
        "commit-3000.json",
    ]
    assert kept.exists() and being_written.exists()
    assert not finished_elsewhere.exists() and not superseded.exists()
    assert not empty_old_run.exists()
    assert starting_run.exists()


def test_load_log_removes_crashed_writers_temp_files_and_reports_torn_ones(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    checkpoint.write_batch(1000, {"ranges": {"rate": [[0, 5]]}})
    checkpoint.write_batch(2000, {"ranges": {"rate": [[5, 9]]}})
    torn = checkpoint.log_dir / "batch-2000.json"
    torn.write_bytes(torn.read_bytes()[:-7])
    temp = checkpoint.log_dir / ".commit-1000.json.tmp-31337"
    temp.write_bytes(b"{")

    found = checkpoint.load_log()

    assert sorted(found.records) == [1000]
    assert found.torn == ["batch-2000.json"]
    assert found.pending == [1000]
    assert not temp.exists()


def test_a_torn_metadata_file_falls_back_to_its_backup(tmp_path):
    checkpoint = CheckpointDir(tmp_path)
    checkpoint.write_metadata({"zeroMs": 5, "batchMs": 1000, "graph": []})
    (tmp_path / "metadata.json").write_bytes(b'{"sha256": "ab", "bo')
    assert checkpoint.read_metadata() == {"zeroMs": 5, "batchMs": 1000, "graph": []}


def test_signature_differences_name_the_stream_and_ignore_the_checkpoint_interval():
    saved = [{"kind": "RateInputDStream", "seed": 1}, {"kind": "StateDStream", "checkpointMs": 10}]
    same_but_interval = [saved[0], {"kind": "StateDStream", "checkpointMs": 20}]
    assert compare_signatures(saved, same_but_interval) == []
    reshaped = [{"kind": "RateInputDStream", "seed": 2}]
    assert compare_signatures(saved, reshaped) == [
        "the checkpoint has 2 streams, the program 1",
        "stream #0 (RateInputDStream): seed was 1, now 2",
    ]


def test_fault_point_kills_at_the_chosen_arrival_only(tmp_path):
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from dstream.runtime.checkpoint.directory import write_document\n"
        "for n in range(5):\n"
        "    write_document(Path(sys.argv[1]) / f'doc-{n}.json', {'n': n}, 'commit-write')\n"
        "    print(n, flush=True)\n"
    )
    env = {**os.environ, "DSTREAM_FAULT_INJECT": "commit-write:3"}
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == -9
    assert done.stdout.split() == ["0", "1"]
    published = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    unpublished = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert published == ["doc-0.json", "doc-1.json"]
    assert [name.partition(".tmp-")[0] for name in unpublished] == [".doc-2.json"]
    write_document(tmp_path / "unset.json", {"n": 9})  # no variable in this process: no-op


def test_files_sink_replaces_an_attempt_and_removes_dead_ones(tmp_path):
    """Dead attempts of the batch go from both staging directories, another batch's stay; the
    replacement leaves the output directory holding the batch's directory only."""
    out = tmp_path / "out"
    final = out / "batch-1000"
    final.mkdir(parents=True)
    (final / "part-00000").write_text("first attempt\n")
    beside, inside = tmp_path / ".dstream-staging-out", out / ".dstream-staging"
    dead = [beside / "tmp-batch-1000-0badf00d", inside / "old-batch-1000-12345678"]
    other_batch = beside / "tmp-batch-10000-0badf00d"
    for directory in (*dead, other_batch):
        directory.mkdir(parents=True)
    remove_earlier_attempts(final)
    assert not any(d.exists() for d in dead) and other_batch.exists()
    assert staging_dir(out) == beside
    again = beside / "tmp-batch-1000-feedbeef"
    again.mkdir()
    (again / "part-00000").write_text("second attempt\n")
    replace_directory(again, final)
    assert (final / "part-00000").read_text() == "second attempt\n"
    assert sorted(p.name for p in beside.iterdir()) == [other_batch.name]
    inside.rmdir()
    assert [p.name for p in out.iterdir()] == ["batch-1000"]


@pytest.mark.parametrize("mount", ["tmpfs", "bind"])
def test_an_output_directory_that_is_a_mount_point_stages_inside_itself(tmp_path, mount):
    """A rename from beside a mount point into it would cross mounts (EXDEV), for a file system
    of its own and for a bind mount of the same one (same device: only the mount table tells)."""
    out = tmp_path / "out"
    with tmpfs(out) if mount == "tmpfs" else bind_mount(tmp_path / "elsewhere", out):
        assert is_mount_point(out)
        assert staging_dir(out) == out / ".dstream-staging"
    assert not is_mount_point(out)
    assert staging_dir(out) == tmp_path / ".dstream-staging-out"
