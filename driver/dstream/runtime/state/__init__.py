"""Keyed state: how state RDDs are stored (in memory today; the state store comes here)."""
