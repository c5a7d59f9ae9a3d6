"""The job service above the engine: the built-in apps, the job runtime that wires a job spec's
source, app and sink, the `dstream` CLI, the Prometheus metrics and the driver pod's entrypoint.

It is the composition root: the only layer that may import `dstream_api` (the HTTP API package).
"""
