"""The real-socket deployment mode: the protocol machines over TCP."""
