"""Keyed state: how state RDDs are stored, and the state store (memory or RocksDB) with its
changelog checkpoints."""
