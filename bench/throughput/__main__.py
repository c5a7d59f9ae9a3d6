import sys

from bench.common import run_tool

TOOLS = {
    "ceiling": "ceiling",  # the rate the programs' own Python allows on this machine
    "profile": "profile",  # where a batch's time goes, from Spark's event log
    "triggers": "triggers",  # where a Structured Streaming trigger's time goes
    "stages": "stages",  # Spark stages and tasks per batch of the stateful operators
    "redis-source": "redis_source",  # the Redis Streams source against the rate source
    "query-pool": "query_pool",  # the batches beside a heavy interactive query
    "worker": "worker",  # one system's trials, driven by `python -m bench` (internal)
}

sys.exit(run_tool("throughput", TOOLS))
