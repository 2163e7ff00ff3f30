"""The SimPy world: population profiles, sampling, dropout, the flow-level network, and rounds in
virtual time driving the sans-IO protocol machines."""
