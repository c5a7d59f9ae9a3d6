"""Scheduling batches: the DStream graph, the batch scheduler, its clocks, the recovery timeline and
Spark's scheduler pools."""
