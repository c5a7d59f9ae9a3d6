"""The driver entrypoint in a Kubernetes pod: `python -m dstream.service.driver JOB.yaml --port 8000
--master k8s://https://kubernetes.default.svc --conf key=value ...`.

Same as `dstream run`, except that the master comes from the operator and progress goes to logs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dstream.service.cli import add_run_arguments, configure_logging, run_job


def main(argv: Sequence[str] | None = None) -> int:
    configure_logging()  # else the pod's log has none of the driver's progress below WARNING
    parser = argparse.ArgumentParser(prog="python -m dstream.service.driver", description=__doc__)
    add_run_arguments(parser, default_master=None)
    return run_job(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
