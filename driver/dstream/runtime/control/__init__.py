"""Control of a running job: the PID rate controller (backpressure), end-to-end latency, and the
failure policy."""
