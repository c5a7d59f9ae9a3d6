import sys

from bench.state.cost import main

sys.exit(main())
