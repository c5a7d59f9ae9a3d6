"""How many words of each length arrive per batch: a user job in its simplest form.

`build` gets the StreamingContext, the job's source stream (one text line per record) and the
manifest's `app.args`, and returns the stream the sink writes. Only public DStream methods are
used, so the same code runs on `pyspark.streaming`.
"""

from operator import add
from typing import Any


def build(ssc: Any, stream: Any, args: dict[str, Any]) -> Any:
    """(length, count) pairs for the words of each batch that have at least `minLength` letters."""
    min_length = int(args.get("minLength", 1))
    return (
        stream.flatMap(lambda line: line.split())
        .filter(lambda word: len(word) >= min_length)
        .map(lambda word: (len(word), 1))
        .reduceByKey(add)
    )
