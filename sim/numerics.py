"""Reductions whose value does not depend on the host's cores: sums of squares without BLAS.

numpy's ``dot`` and ``linalg.norm`` call BLAS, and OpenBLAS splits a long dot product over its threads, by
default as many as the host has cores. The partial sums are then added in another order, and the last bits
of the result change with the core count: for 48 of 50 random vectors of 10^6 values, one BLAS thread and
two gave different sums on the 2-core host of docs/performance.md. A clipping factor or a norm bound
computed that way rounds differently on another host, and so may an encoding made from it. BLAS threads
started from several threads at once (the clients of a step on threads, :class:`sim.loopback.ClientSteps`)
also compete for the same cores: 16 clients' updates encoded on two threads took longer than in turn.

These sums run on the calling thread, in an order fixed here: blocks of :data:`BLOCK` values in turn, each
converted to float64 and summed by numpy's ``einsum`` kernel (which uses no BLAS). That kernel is fixed when
numpy is built, so the bits may still differ between numpy builds or processor architectures; they do not
differ with the number of cores or threads.
"""

from __future__ import annotations

import math

import numpy as np

BLOCK = 1 << 15
"""Values per block: 256 KiB of float64, within a core's cache."""


def sum_of_squares(x: np.ndarray) -> float:
    """``sum(x_i^2)`` of a 1-D vector, in float64 (inputs of another dtype are converted block by block)."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"sum_of_squares takes a vector, not an array of shape {x.shape}")
    if x.dtype.kind not in "biuf" or x.dtype.itemsize > 8:
        raise ValueError(f"sum_of_squares takes real values of at most 64 bits, not {x.dtype}")
    n = x.shape[0]
    total = 0.0
    buffer = np.empty(min(BLOCK, n))
    for start in range(0, n, BLOCK):
        block = buffer[: min(BLOCK, n - start)]
        block[:] = x[start : start + BLOCK]
        total += float(np.einsum("i,i->", block, block))
    return total


def l2_norm(x: np.ndarray) -> float:
    """The Euclidean norm of a 1-D vector: ``sqrt(`` :func:`sum_of_squares` ``)``."""
    return math.sqrt(sum_of_squares(x))
