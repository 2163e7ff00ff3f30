"""Availability traces: the format, loading and validation, FedScale import, synthesis, statistics."""
