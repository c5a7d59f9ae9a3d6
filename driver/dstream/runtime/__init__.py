"""The engine's runtime: the DStream graph, the batch scheduler, recovery, checkpoints, durable
state, backpressure, the failure policy, clocks and Spark's scheduler pools.

It may import `dstream.worker` and `dstream.spec`; never the public API modules (context,
dstream, windows, state, sources), the connectors or the service, except under TYPE_CHECKING.
"""
