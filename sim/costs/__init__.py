"""The virtual-time cost model of compute operations; :mod:`sim.profiling` measures it."""
