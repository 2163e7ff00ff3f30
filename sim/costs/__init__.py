"""The virtual-time cost model of compute operations and the profiler that fits it."""
