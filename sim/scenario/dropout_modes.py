"""The ``dropout.mode`` values: one :class:`DropoutMode` object per mode, registered in :data:`MODES`.

- ``fixed``: exactly ``floor(rate * n + 1/2)`` of the n sampled clients (rounded half up), chosen
  uniformly; Dordis section 6.1 ("clients randomly drop with a configurable rate in each round").
- ``bernoulli``: each sampled client independently with probability ``rate``.
- ``per_client``: client i has its own probability p_i, drawn once per run: ``high`` with probability
  ``high_fraction``, otherwise uniform in ``low`` (DReS-FL section 6: 0.99 with probability 1/2, else
  U[0, 0.1]); each round each sampled client drops with its p_i. p_i is computed from i when it is
  needed, from two keyed uniforms of the client's id (:mod:`sim.keyed`), so no array of the
  population's size is held.

A scenario may name its own mode, a plug-in (``dropout: {model: "pkg.module:Name", args: {...}}``, or an
installed ``dropsim.dropout`` entry point's name as ``model`` or ``mode``): a :class:`DropoutMode` subclass built
with ``args`` as keyword arguments (:func:`dropout_mode`), whose methods see ``args`` as ``config.options``.

A mode declares the keys of the ``dropout:`` section it reads (the parser reads and checks them) and draws:
:meth:`DropoutMode.prepare` once per run (its per-run state), :meth:`DropoutMode.drops` each round from that
round's ``DROPOUT`` stream (:class:`sim.clients.dropout.DropoutModel` runs them). The modes live here, beside
the scenario's types, because the parser must know them and :mod:`sim.clients` imports the scenario (not the
other way round); :mod:`sim.clients.dropout` re-exports them.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.keyed import keyed_uniform, stream_keys
from sim.plugins import PluginError, call, resolve
from sim.seeds import Stream

if TYPE_CHECKING:
    from sim.scenario.reader import Reader
    from sim.scenario.types import Dropout


class DropoutMode:
    """One ``dropout.mode``. The base draws nothing; a mode overrides :meth:`drops` (and :meth:`prepare`
    for per-run state)."""

    name = ""
    keys: tuple[str, ...] = ()
    """Keys of the ``dropout:`` section only this mode reads (besides ``rate``, ``stage`` and ``silent``)."""
    uses_rate = True
    """Whether ``dropout.rate`` applies."""

    def can_drop(self, config: Dropout) -> bool:
        """Whether any client may drop under ``config``."""
        return (config.rate or 0) > 0

    def read_options(self, r: Reader) -> dict[str, Any]:
        """Read and check the keys of the ``dropout:`` section only this mode reads (its :attr:`keys`), with
        their defaults; the parser refuses them under another mode."""
        return {}

    def prepare(self, config: Dropout, population: int, seed: int) -> Any:
        """Per-run state, drawn once for a population of ``population`` clients (None: the mode has none)."""
        return None

    def drops(self, config: Dropout, state: Any, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        """The sampled clients (a subset of ``sampled``, in its order) that drop this round, drawn from ``rng``."""
        raise NotImplementedError


class Fixed(DropoutMode):
    name = "fixed"

    def drops(self, config: Dropout, state: Any, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        n = int(sampled.shape[0])
        k = min(n, math.floor(config.rate * n + 0.5))
        return sampled[np.sort(rng.choice(n, size=k, replace=False))] if k else sampled[:0]


class Bernoulli(DropoutMode):
    name = "bernoulli"

    def drops(self, config: Dropout, state: Any, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        n = int(sampled.shape[0])
        return sampled[rng.random(n) < config.rate]


class PerClient(DropoutMode):
    name = "per_client"
    keys = ("high", "high_fraction", "low")
    uses_rate = False

    def can_drop(self, config: Dropout) -> bool:
        return True

    def read_options(self, r: Reader) -> dict[str, Any]:
        return {
            "high": r.number("high", 0.99, lo=0, hi=1),
            "high_fraction": r.number("high_fraction", 0.5, lo=0, hi=1),
            "low": r.interval("low", (0.0, 0.1), lo=0, hi=1),
        }

    def prepare(self, config: Dropout, population: int, seed: int) -> DropProbabilities:
        """Each client's drop probability, computed from its id (keys from ``DROPOUT`` stream 0)."""
        keys = stream_keys(seed, Stream.DROPOUT, 0, count=2)
        options = config.options
        return DropProbabilities(population, options["high"], options["high_fraction"], options["low"], keys)

    def drops(self, config: Dropout, state: Any, rng: np.random.Generator, sampled: np.ndarray) -> np.ndarray:
        n = int(sampled.shape[0])
        return sampled[rng.random(n) < state[sampled]]


class DropProbabilities:
    """``per_client``'s p_i of clients 0..size-1: ``probabilities[ids]`` (ids: an int array). p_i is
    ``high`` when the first keyed uniform of i is below ``high_fraction``, otherwise ``low[0] + (low[1] -
    low[0]) * v`` with v the second."""

    def __init__(self, size: int, high: float, high_fraction: float, low: tuple[float, float], keys: Any) -> None:
        self.size = size
        self.high, self.high_fraction, self.low = high, high_fraction, low
        self._keys = keys

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __getitem__(self, ids: np.ndarray) -> np.ndarray:
        is_high = keyed_uniform(ids, self.size, self._keys[0]) < self.high_fraction
        lo, hi = self.low
        return np.where(is_high, self.high, lo + (hi - lo) * keyed_uniform(ids, self.size, self._keys[1]))


MODES: dict[str, DropoutMode] = {}
"""Every ``dropout.mode``, by name (the first is the default)."""


def register_dropout_mode(mode: DropoutMode) -> DropoutMode:
    """Make ``mode`` a ``dropout.mode`` (its name must be new)."""
    if mode.name in MODES:
        raise ValueError(f"dropout mode {mode.name!r} is registered already")
    MODES[mode.name] = mode
    return mode


for _mode in (Fixed(), Bernoulli(), PerClient()):
    register_dropout_mode(_mode)

DEFAULT_MODE = Fixed.name
"""The ``dropout.mode`` of a scenario that names none."""


_PLUGINS: dict[tuple[str, str], DropoutMode] = {}
"""Plug-in modes this process has built, by name and args."""


def dropout_mode(config: Dropout, where: str = "dropout.model") -> DropoutMode:
    """The mode ``config`` names: one of :data:`MODES`, else its plug-in (``config.model``) built with its args
    (``config.options``), once per process. A plug-in that cannot be built, or is no :class:`DropoutMode`, is a
    :class:`sim.plugins.PluginError` starting with ``where``."""
    if config.model is None:
        return MODES[config.mode]
    key = (config.model, json.dumps(config.options, sort_keys=True, default=repr))
    built = _PLUGINS.get(key)
    if built is not None:
        return built

    obj, ref = resolve("dropout", config.model, where)
    if isinstance(obj, DropoutMode):
        if config.options:
            raise PluginError(f"{where}: {ref.path} is a dropout mode object, which takes no args; name its class")
        mode = obj
    else:
        mode = call(obj, config.options, {}, ref.path, where)
    if not isinstance(mode, DropoutMode):
        raise PluginError(
            f"{where}: {ref.path} gave {_described(mode)}, not a dropout mode: a subclass of "
            "sim.scenario.dropout_modes.DropoutMode is expected (docs/plugins.md)"
        )
    if type(mode).drops is DropoutMode.drops:
        raise PluginError(f"{where}: {ref.path} does not implement drops(config, state, rng, sampled)")
    _PLUGINS[key] = mode
    return mode


def _described(obj: object) -> str:
    return f"class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"


def may_drop(mode: DropoutMode, config: Dropout) -> bool:
    """Whether any client may drop under ``config``: the mode's :meth:`DropoutMode.can_drop`, except that a
    plug-in without a rate that keeps the base's (which reads the rate) may."""
    if config.model is not None and not mode.uses_rate and type(mode).can_drop is DropoutMode.can_drop:
        return True
    return mode.can_drop(config)
