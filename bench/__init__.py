"""Benchmarks of the engine against pyspark.streaming and Structured Streaming (bench/README.md).

By what they measure, each sub-package with one entry point:
- `throughput/`: each system's maximum sustained rate per workload (searches, their trials, the
  systems and programs, the reference outputs), the ceiling of the programs' own Python, and
  profiles of a batch (`python -m bench.throughput <tool>`);
- `recovery/`: a driver or executor killed under load, and how soon batches are back on time
  (`python -m bench.recovery <tool>`);
- `backpressure/`: an overload step, dstream against pyspark.streaming
  (`python -m bench.backpressure`).

Below them `common.py` (paths, seed and record shape, the engines and daemons, Spark settings,
process start) and `machine.py` (the machine's description and the load gate); above them
`run.py` and `report.py`: `python -m bench` searches the maxima, runs the recovery experiments
at half of them and writes the day's results file. No module imports one above it
(an import-linter contract in pyproject.toml, which `make lint` checks).
"""
