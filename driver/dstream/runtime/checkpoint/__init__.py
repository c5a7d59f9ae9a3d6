"""Checkpoint and recovery: the checkpoint directory and batch log, each stream's checkpoint needs,
durable batch reductions, atomic output directories, and recovery from a checkpoint."""
