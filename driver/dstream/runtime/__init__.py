"""The engine's runtime, in rooms that import only downward: `scheduling` (the graph, the batch
scheduler and its retries, clocks, the recovery timeline, Spark's scheduler pools) >
`leadership` (who leads a checkpoint: leases, epochs and the fence, a standby's following and
shadow) > `checkpoint` (its files, the batch log, durable reductions, atomic output directories,
recovery) > `control` (backpressure, latency, the failure policy) | `state` (how state is
stored), over a few shared leaves (time conversions, task errors, shipping dstream's code).

It may import `dstream.worker` and `dstream.spec`; never the public API modules (context,
dstream, windows, state, sources), the connectors or the service, except under TYPE_CHECKING.
"""
