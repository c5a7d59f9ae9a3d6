"""The chaos end-to-end suite: a StreamingJob on a real Kubernetes cluster, with executor, driver
and operator pods deleted while it runs, and its committed output checked against a fault-free
reference (see e2e/README.md). Run it with `python -m e2e.chaos --help`."""
