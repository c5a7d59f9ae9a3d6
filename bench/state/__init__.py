"""A keyed-state job's cost per batch as its state grows: mapWithState on the state store
(memory, RocksDB) against updateStateByKey's state RDDs (docs/state.md)."""
