import sys

from bench.backpressure.step import main

sys.exit(main())
