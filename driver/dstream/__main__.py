"""`python -m dstream run JOB.yaml` is the same as `dstream run JOB.yaml`."""

import sys

from dstream.service.cli import main

sys.exit(main())
