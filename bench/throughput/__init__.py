"""Each system's maximum sustained rate per workload, and what bounds it.

`searches` interleaves the rate searches (`search`) of every system, each trial run by a worker
process (`worker`) on a system of `systems` running a program of `programs` on the input of
`feed` (or, with `--source kafka`, of a topic `kafka_input` feeds), its output checked against `reference` and judged by `trial`; `ceiling` measures the
programs' own Python alone, `profile` and `stages` look inside a batch, `triggers` inside a
Structured Streaming trigger, `redis_source` sets a
broker source against the rate source, `query_pool` a heavy REST query beside the stream it reads. Entry point: `python -m bench.throughput <tool>`.
May import `bench.common` and `bench.machine` only.
"""
