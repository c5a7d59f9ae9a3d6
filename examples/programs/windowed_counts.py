"""Page views counted over a sliding window of 3 batches, incrementally: each step adds the
entering batch and subtracts the leaving one (the inverse function) instead of recounting the
window. Pages whose count fell to zero are dropped by filterFunc. Needs a checkpoint directory.

    python examples/programs/windowed_counts.py [checkpoint-dir]
"""

import operator
import sys
import tempfile

from engine import StreamingContext, local_spark_context, run_batches

BATCH_SECONDS = 0.5
VIEWS = [
    ["/home", "/home", "/cart"],
    ["/home", "/search"],
    ["/cart", "/cart", "/home"],
    ["/search"],
    [],
]
BATCHES = len(VIEWS) + 2  # until the last views have left the window

if __name__ == "__main__":
    sc = local_spark_context("windowed-counts")
    ssc = StreamingContext(sc, BATCH_SECONDS)
    ssc.checkpoint(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    views = ssc.queueStream([sc.parallelize(batch) for batch in VIEWS])
    counts = views.map(lambda page: (page, 1)).reduceByKeyAndWindow(
        operator.add,
        operator.sub,
        windowDuration=3 * BATCH_SECONDS,
        slideDuration=BATCH_SECONDS,
        filterFunc=lambda page_count: page_count[1] > 0,
    )
    counts.pprint()
    run_batches(ssc, BATCHES)
