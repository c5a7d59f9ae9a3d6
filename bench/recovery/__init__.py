"""A driver or an executor killed under load, and how soon each system's batches are back on
time: `faults` runs the faults against `subject` processes running the throughput benchmark's
systems (bench.throughput.systems). Entry point: `python -m bench.recovery <tool>`.
May import `bench.throughput`, `bench.common` and `bench.machine`.
"""
