"""Sans-IO aggregation protocols: pure state machines and their wire messages.

Nothing in this package imports simpy, asyncio, socket or torch, or reads a clock: the SimPy engine and
the socket driver both run these same machines (docs/architecture.md).
"""
