"""Benchmarks of the engine against pyspark.streaming and Structured Streaming (`make bench`)."""
