"""The `dstream` command: run a StreamingJob manifest locally, or validate one.

Exit codes: 0 success (including a graceful stop), 2 invalid manifest or arguments, 3 a checkpoint
that cannot be used (written by a different program, or damaged beyond exact recovery: `--fresh`
starts over; or led by another live driver: `--standby` waits for it), 4 a source failed
(unreachable, input trimmed away, login refused), 5 a batch failed after every retry of its
failurePolicy and was left uncommitted (a restart runs it again), 6 deposed: another driver took
the checkpoint over under a newer epoch (named in the message), or the Kubernetes Lease that
elects the job's drivers went to another one, and this one stopped without committing more,
1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from dstream.runtime.checkpoint.directory import (
    CheckpointMismatchError,
    CheckpointUnrecoverableError,
)
from dstream.spec import Checkpoint, SpecError, StreamingJob, load_job

EXIT_INVALID = 2
EXIT_CHECKPOINT_MISMATCH = 3
EXIT_SOURCE_ERROR = 4
EXIT_BATCH_FAILED = 5
EXIT_DEPOSED = 6


def _conf_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    return key, value


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="dstream", description=__doc__.splitlines()[0])
    commands = root.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a StreamingJob manifest until stopped")
    add_run_arguments(run)
    validate = commands.add_parser("validate", help="check a StreamingJob manifest")
    validate.add_argument("manifest")
    return root


def add_run_arguments(
    run: argparse.ArgumentParser, default_master: str | None = "local[2]"
) -> None:
    run.add_argument("manifest", help="StreamingJob YAML (the same file kubectl applies)")
    run.add_argument("--port", type=int, default=8000, help="API and /metrics port (0: none)")
    run.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the API listens on (default 127.0.0.1, this machine only); any other "
        "needs a token in DSTREAM_API_TOKEN or DSTREAM_API_TOKEN_FILE",
    )
    run.add_argument("--master", default=default_master, help="Spark master (default local[2])")
    run.add_argument(
        "--duration", type=float, default=None, help="stop gracefully after this many seconds"
    )
    run.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="checkpoint directory instead of the manifest's spec.checkpoint.path",
    )
    run.add_argument(
        "--fresh",
        action="store_true",
        help="move an existing checkpoint aside and start from scratch",
    )
    run.add_argument(
        "--conf",
        type=_conf_pair,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Spark setting (repeatable)",
    )
    run.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    run.add_argument(
        "--standby",
        action="store_true",
        help="start Spark and the job, then wait for the checkpoint's lead (following the "
        "checkpoint meanwhile) and take over when its leader dies or stops renewing its lease",
    )


def load_or_exit(path: str) -> StreamingJob:
    try:
        return load_job(path)
    except SpecError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID) from None
    except OSError as error:
        print(f"error: cannot read {path}: {error.strerror}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID) from None


def with_path(checkpoint: Checkpoint | None, path: str) -> Checkpoint:
    """The manifest's checkpoint settings at another path (cluster paths rarely exist locally)."""
    if checkpoint is None:
        return Checkpoint(path=path)
    return checkpoint.model_copy(update={"path": path})


def refuse_open_api_or_exit(args: argparse.Namespace) -> None:
    """Before Spark starts: an API beyond loopback without a token is refused (exit 2)."""
    if not args.port:
        return
    from dstream_api.auth import OpenToNetworkError, refuse_open_to_network

    try:
        refuse_open_to_network(args.host)
    except OpenToNetworkError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(EXIT_INVALID) from None


class StandbyStoppedError(Exception):
    """A standby told to stop before it led: it has nothing to finish."""


def run_job(args: argparse.Namespace) -> int:
    """Start the job (recovering from its checkpoint), serve the API, stop on SIGTERM/SIGINT."""
    job = load_or_exit(args.manifest)
    refuse_open_api_or_exit(args)
    if args.checkpoint:
        job.spec.checkpoint = with_path(job.spec.checkpoint, args.checkpoint)
    from dstream.runtime.control.failure import BatchFailedError
    from dstream.runtime.leadership.fencing import DeposedError
    from dstream.runtime.leadership.lease import CheckpointInUseError
    from dstream.service.job import JobRuntime, ProgressPrinter
    from dstream.sources import SourceError

    try:
        runtime = JobRuntime(job, args.master, dict(args.conf), fresh=args.fresh)
    except SourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_SOURCE_ERROR
    if not args.quiet:
        runtime.ssc.addStreamingListener(ProgressPrinter())
    server = None
    if args.port:
        from dstream_api.server import serve_in_background

        from dstream.service.job_view import RuntimeView

        server = serve_in_background(RuntimeView(runtime), args.port, args.host)
        print(
            f"dstream: job {job.metadata.name} serving http://{args.host}:{args.port} "
            f"(/v1/status, /metrics)",
            flush=True,
        )

    def request_stop(signum: int, _frame: object) -> None:
        print(
            f"dstream: {signal.Signals(signum).name} received, finishing the current batch",
            flush=True,
        )
        runtime.stop_requested = True

    def stop_standing_by(signum: int, frame: object) -> None:
        """Until it leads, a standby ends at once. Its own handler, not the default action: a
        pod's main process (PID 1 of its namespace) ignores a signal it has no handler for, so
        a deleted standby pod would run on, and could even take the lead, for its whole grace
        period."""
        scheduler = runtime.scheduler
        if scheduler is not None and scheduler.fence is not None:  # it leads already
            request_stop(signum, frame)
            return
        raise StandbyStoppedError(f"{signal.Signals(signum).name} received while standing by")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_standing_by if args.standby else request_stop)
    try:
        runtime.start(standby=args.standby)
    except StandbyStoppedError as stopped:
        print(f"dstream: {stopped}", flush=True)
        runtime.sc.stop()
        return 0
    except (CheckpointMismatchError, CheckpointUnrecoverableError, CheckpointInUseError) as error:
        print(f"error: {error}", file=sys.stderr)
        runtime.sc.stop()
        return EXIT_CHECKPOINT_MISMATCH
    except DeposedError as error:
        print(f"error: {error}", file=sys.stderr)
        runtime.sc.stop()
        return EXIT_DEPOSED
    except SourceError as error:
        print(f"error: {error}", file=sys.stderr)
        runtime.sc.stop()
        return EXIT_SOURCE_ERROR
    try:
        runtime.run_until_stopped(args.duration)
    except SourceError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_SOURCE_ERROR
    except BatchFailedError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BATCH_FAILED
    except DeposedError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_DEPOSED
    finally:
        if server is not None:
            server.should_exit = True
    print(f"dstream: job {job.metadata.name} stopped", flush=True)
    return 0


def validate_job(args: argparse.Namespace) -> int:
    job = load_or_exit(args.manifest)
    print(f"{args.manifest}: valid StreamingJob {job.metadata.name!r}")
    return 0


def configure_logging() -> None:
    """The driver's own progress at INFO (the takeover, the recovery timeline), py4j's chatter
    not."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()
    args = parser().parse_args(argv)
    if args.command == "validate":
        return validate_job(args)
    return run_job(args)


if __name__ == "__main__":
    sys.exit(main())
