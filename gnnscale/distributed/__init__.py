"""Distributed runtime: torchrun environment, process groups, collectives, feature store, failure detection."""
