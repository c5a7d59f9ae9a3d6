"""Leadership of a checkpoint: the local lease, the Kubernetes Lease, epochs and the fence, and a
standby's following and shadow of its leader."""
