"""An overload step, dstream against pyspark.streaming: `step` runs it (calibration, then the
offered rate stepped up tenfold) in a worker process per system, `overload` holds its
decisions (schedule, cost model, settle time, output check), `report` writes the results.
Entry point: `python -m bench.backpressure`. May import `bench.common` and `bench.machine` only.
"""
