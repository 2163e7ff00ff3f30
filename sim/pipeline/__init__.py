"""Pipelined chunk aggregation: the analytic model (Dordis section 4, Hyades appendix F).

:mod:`sim.pipeline.recurrence` gives the completion times of m equal chunk-aggregation tasks through
stages on shared resources; :mod:`sim.pipeline.performance` holds the per-stage latency model of Dordis
eq. 3 and its fit; the SimPy side (gated resources that run one chunk's stage at a time) is
:mod:`sim.round.gates`.
"""
