"""Running word counts with updateStateByKey: each batch adds its words to the totals so far.
updateStateByKey needs a checkpoint directory (its state is checkpointed to cut lineage).

    python examples/programs/stateful_wordcount.py [checkpoint-dir]
"""

import sys
import tempfile

from engine import StreamingContext, local_spark_context, run_batches

LINES = [
    ["the cat sat", "on the mat"],
    ["the dog sat"],
    [],
    ["a cat and a dog"],
]
BATCHES = len(LINES) + 1  # one batch more: totals stay when no words arrive


def add_counts(new_counts, total):
    """New counts of a word in this batch, and its total so far (None the first time)."""
    return sum(new_counts) + (total or 0)


if __name__ == "__main__":
    sc = local_spark_context("stateful-wordcount")
    ssc = StreamingContext(sc, 0.5)
    ssc.checkpoint(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    lines = ssc.queueStream([sc.parallelize(batch) for batch in LINES])
    words = lines.flatMap(str.split).map(lambda word: (word, 1))
    words.updateStateByKey(add_counts).pprint(20)
    run_batches(ssc, BATCHES)
