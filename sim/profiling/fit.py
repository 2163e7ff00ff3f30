"""Fitting the cost model's linear costs to measured times, every coefficient non-negative (a negative
cost per feature would make some operation take negative time)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def fit_nonnegative(features: Sequence[str], rows: Sequence[dict[str, float]], seconds: list[float]) -> dict[str, Any]:
    """Least-squares fit of ``seconds`` on ``features`` with every coefficient >= 0."""
    active = list(features)
    y = np.asarray(seconds)
    while True:
        x = np.asarray([[1.0 if f == "const" else row[f] for f in active] for row in rows])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        negative = [f for f, c in zip(active, coef, strict=True) if c < 0]
        if not negative or len(active) == 1:
            break
        active.remove(min(negative, key=lambda f: coef[active.index(f)]))
    coef = np.maximum(coef, 0.0)
    pred = x @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return {
        "coef": {f: float(c) for f, c in zip(active, coef, strict=True)},
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        "points": len(rows),
    }
