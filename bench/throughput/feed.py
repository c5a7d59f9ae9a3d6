"""The same deterministic input for every system: batch k holds the records of interval k.

All three systems read the records of `dstream.worker.textgen`: record (partition p, offset n) is line
`line_index(seed, p, n)` of a pool of 100-byte lines. Batch k (1-based) of a stream at `rate`
records per second over P partitions holds the global sequence numbers [rate*(k-1), rate*k), and
sequence number v is record (v % P, v // P): exactly how `RateInputDStream` splits its offsets.

How each system gets its records, chosen so that input costs each of them what a real source
would (a pool lookup, no per-record randomness):
- dstream: its own `ssc.rateStream` (offset ranges planned on the driver, lines made in tasks).
- pyspark.streaming: a constant one-element input stream whose `transform(time, rdd)` builds the
  same per-batch RDD as `RateInputDStream._read` (a parallelized slice list, lines made in tasks).
- Structured Streaming: the `rate-micro-batch` source (exactly `rate` rows per micro-batch, so a
  batch is an interval, as in the DStream systems), the splitmix64 index computed in the JVM with
  Spark SQL's 64-bit arithmetic, and the pool joined by index as a broadcast table, so the lines
  are JVM strings from the start, as from any JVM-native source (Kafka, files).

Grep runs both ways for every system, so that where lines are made is not mixed up with where
they are filtered (`programs.JVM_LINES`): `grep` makes them in Python everywhere (Structured
Streaming: the `rate-micro-batch` numbers turned into lines by `python_lines` in `mapInArrow`),
`grep-jvm` in the JVM everywhere (the DStream systems: each batch's lines made by Spark SQL as
above, `jvm_lines`, and handed to Python as any JVM source's records are).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from bench.common import load_textgen, textgen

_MASK64 = (1 << 64) - 1


def batch_slices(
    rate: int, partitions: int, k: int, batch_ms: int = 1000
) -> list[tuple[int, int, int]]:
    """(partition, start offset, end offset) of batch k: the offsets that arrived in interval k
    (of batch_ms), as RateInputDStream counts them."""

    def available(batches: int) -> list[int]:
        base, extra = divmod(rate * batches * batch_ms // 1000, partitions)
        return [base + (1 if p < extra else 0) for p in range(partitions)]

    before, after = available(k - 1), available(k)
    return [(p, before[p], after[p]) for p in range(partitions)]


def slice_lines(seed: int, record_bytes: int) -> Any:
    """The task function that turns slices into lines, as RateInputDStream's tasks do."""

    def generate(_split: int, items: Iterator[tuple[int, int, int]]) -> Iterator[str]:
        lines = load_textgen().lines  # not the module: cloudpickle would import it by name
        for partition, start, end in items:
            yield from lines(seed, record_bytes, partition, start, end)

    return generate


def python_lines(partitions: int, seed: int, record_bytes: int) -> Any:
    """The mapInArrow function that turns batches of (value, timestamp) rows into (line,
    timestamp) rows, the line of sequence number `value` made in Python as the rate source's
    tasks make it."""

    def generate(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        made = load_textgen()  # not the module: cloudpickle would import it by name
        pool = made.line_pool(seed, record_bytes)
        for batch in batches:
            values = batch.column("value").to_pylist()
            lines = [pool[made.line_index(seed, v % partitions, v // partitions)] for v in values]
            yield pa.RecordBatch.from_arrays(
                [pa.array(lines, pa.string()), batch.column("timestamp")], ["line", "timestamp"]
            )

    return generate


_POOLS: dict[tuple[int, int, int], Any] = {}  # (SparkContext, seed, record_bytes) -> DataFrame


def jvm_lines(first: int, last: int, partitions: int, seed: int, record_bytes: int) -> Any:
    """The lines of sequence numbers [first, last) made in the JVM by Spark SQL (the pool joined
    by index, as in Structured Streaming's input), as an RDD of Python strings: what a DStream
    reading a JVM source gets."""
    from operator import itemgetter

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as sf

    spark = SparkSession.builder.getOrCreate()
    key = (id(spark.sparkContext), seed, record_bytes)
    if key not in _POOLS:  # once per context, not per batch
        spark.conf.set("spark.sql.ansi.enabled", "false")  # pool_index_column wraps
        _POOLS[key] = pool_frame(spark, seed, record_bytes).cache()
    numbers = spark.range(first, last, numPartitions=partitions)
    indexed = numbers.withColumn("idx", pool_index_column("id", partitions, seed))
    return indexed.join(sf.broadcast(_POOLS[key]), "idx").select("line").rdd.map(itemgetter(0))


def _signed(value: int) -> int:
    """A 64-bit pattern as the signed long Spark SQL stores."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


def pool_index_column(value: str, partitions: int, seed: int) -> Any:
    """textgen.line_index of the sequence number in column `value`, as a Spark SQL expression.

    Needs `spark.sql.ansi.enabled=false`, so that long arithmetic wraps like the uint64 arithmetic
    of splitmix64; the pool size is a power of two, so the final modulo is a mask.
    """
    from pyspark.sql import functions as sf

    assert textgen.POOL_SIZE & (textgen.POOL_SIZE - 1) == 0
    partition = sf.expr(f"{value} % {partitions}").cast("long")
    offset = sf.expr(f"{value} div {partitions}").cast("long")
    z = (
        offset * sf.lit(_signed(0x9E3779B97F4A7C15))
        + partition * sf.lit(_signed(0xBF58476D1CE4E5B9))
        + sf.lit(seed).cast("long")
    )
    z = z.bitwiseXOR(sf.shiftrightunsigned(z, 30)) * sf.lit(_signed(0xBF58476D1CE4E5B9))
    z = z.bitwiseXOR(sf.shiftrightunsigned(z, 27)) * sf.lit(_signed(0x94D049BB133111EB))
    z = z.bitwiseXOR(sf.shiftrightunsigned(z, 31))
    return z.bitwiseAND(sf.lit(textgen.POOL_SIZE - 1)).cast("int")


def pool_frame(spark: Any, seed: int, record_bytes: int) -> Any:
    """The line pool as a small (index, line) DataFrame to broadcast."""
    pool = textgen.line_pool(seed, record_bytes)
    return spark.createDataFrame(list(enumerate(pool)), "idx int, line string")
