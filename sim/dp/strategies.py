"""How much noise each client adds, which part is removed under dropout, and what is left: one round.

Notation (Dordis section 3, Hyades section 5): sigma*^2 = ``target``, the central noise variance a round
must have (model units: the variance per coordinate of the noise in the SUM of clipped updates); n = |U|
sampled clients; T = ``tolerance`` (a count); |D| = ``dropped``, the sampled clients whose input is not in
the aggregate; m = n - |D| survivors; f = t / (t - T_C), the collusion inflation of Dordis 3.3 (t the
SecAgg threshold, T_C the tolerated colluders).

A client's noise is a list of components: component 0 is never removed, components 1.. may be removed by
the server (each expanded from its own seed). The strategies:

- ``orig``: chi(f sigma*^2 / n); nothing removed; residual m/n f sigma*^2.
- ``early``: ``orig``, and the server stops training before the budget would be passed.
- ``con``: chi(f sigma*^2 / floor(n (1 - x))) for a guessed dropout rate x.
- ``xnoise`` (XNoise-Prec, Dordis Definition 2): n_0 ~ chi(f sigma*^2 / n), n_k ~ chi(f sigma*^2 / ((n-k+1)(n-k)))
  for k = 1..T; with |D| <= T the components k > |D| of every survivor are removed and the residual is
  exactly f sigma*^2; with |D| > T nothing is removed and the residual is m / (n - T) f sigma*^2.
- ``xnoise-appr`` (Hyades Definition 4): tau = ceil(log2 T), eta = f sigma*^2 T / (2^tau n (n - T));
  components eta and eta 2^(k-2) for k = 2..tau+1 besides f sigma*^2 / n; a survivor removes components
  summing to floor(lambda / eta) eta, lambda = (T - |D|) f sigma*^2 / ((n - T) m); residual in
  [f sigma*^2, f sigma*^2 (1 + 1/(n - T))].
- ``rebasing`` (Baek et al. 2021): chi(f sigma*^2 / n) first; every survivor then sends -n_0 + chi(f sigma*^2 / m)
  (a model-sized vector); residual exactly f sigma*^2, unless a survivor drops during that step.
- ``committee`` (Aero-style worst case): chi(f sigma*^2 / (n - T)) sized for T dropouts, never removed.
- ``central``: the (trusted) server adds chi(sigma*^2) to the aggregate; clients add nothing.
- ``local``: every client adds chi(sigma*^2) itself (private against anyone who sees its input alone);
  residual m sigma*^2.
- ``none``: no noise.

Each is one :class:`Strategy` object in :data:`STRATEGIES` (its behaviour as attributes and methods); a
scenario may name its own, a plug-in (``privacy.strategy: "pkg.module:Name"``, :func:`plugin_strategy`),
checked against the interface before it is used (:func:`check_strategy`). A :class:`RoundNoise` names its
strategy and dispatches to it (:func:`strategy_named`). What a strategy needs of the aggregation protocol
(``requires``) is decided on the protocol's side (:meth:`sim.protocol.spec.ProtocolSpec.supports`): this module
knows no protocol.

The privacy a round really gives is accounted at :meth:`RoundNoise.accounted`: the residual, less the
share the T_C colluders know of it (their own noise, the residual being spread evenly over survivors).
Variances are exact :class:`fractions.Fraction` of the (float) target, so "the residual equals the target"
is an exact statement.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any

NOTHING = "nothing"
"""What a strategy that adds no noise requires of the aggregation protocol."""
ENCODED = "encoded"
"""A strategy whose noise is added to fixed-point encodings (any encoded protocol)."""
SECURE = "secure"
"""A strategy whose clients share the central noise, which only secure aggregation (masks with secret-shared
seeds) keeps from the server."""


@dataclass(frozen=True)
class Strategy:
    """One ``privacy.strategy``: what each client adds, what is removed under dropout, and what is left.

    The defaults are Orig's: every client adds chi(sigma^2 / n), nothing is removed. A strategy overrides
    :meth:`components` (and :meth:`removed`, :meth:`residual`, :meth:`accounted` where it differs); ``plan``
    is the round's :class:`RoundNoise`, whose ``sigma`` is the target with the collusion inflation of
    ``distributed`` strategies. Register a new one with :func:`register_strategy`; the aggregation protocols
    decide from ``requires`` whether they can run it."""

    name: str
    requires: str = SECURE
    """What the aggregation protocol must offer: :data:`NOTHING`, :data:`ENCODED` or :data:`SECURE`."""
    enabled: bool = True
    """Whether it adds noise at all (False only for ``none``: the run has no DP)."""
    distributed: bool = True
    """Whether clients add the central noise together (the collusion inflation t / (t - T_C) applies)."""
    removes: bool = False
    """Whether clients share seeds of removable components and the server removes excess ones (XNoise: the
    protocols' noise-removal step and dropout stage exist only then)."""
    rebasing: bool = False
    """Whether every survivor replaces its first component with fresh noise sized for the survivors."""
    central: bool = False
    """Whether the (trusted) server adds the noise to the aggregate."""
    early: bool = False
    """Whether the server stops training before a round would pass the budget."""

    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        """Variance of each client component (model units); index 0 is never removed."""
        return (plan.sigma / plan.sampled,)

    def server(self, plan: RoundNoise) -> Fraction:
        """Variance the server adds to the aggregate."""
        return plan.sigma if self.central else Fraction(0)

    def removed(self, plan: RoundNoise, dropped: int) -> tuple[int, ...]:
        """Indices of the components every survivor loses when ``dropped`` clients dropped (called with
        ``dropped <= tolerance`` and survivors left)."""
        return ()

    def residual(self, plan: RoundNoise, dropped: int) -> Fraction:
        """Central variance left in the aggregate (called with survivors left)."""
        m = plan.sampled - dropped
        if self.central:
            return plan.server
        gone = set(plan.removed(dropped))
        per_client = sum((v for k, v in enumerate(plan.components) if k not in gone), Fraction(0))
        return m * per_client

    def accounted(self, plan: RoundNoise, dropped: int) -> Fraction:
        """The variance the round's privacy is accounted at: against the server, with the T_C colluders' own
        noise known to it."""
        m = plan.sampled - dropped
        residual = plan.residual(dropped)
        if m <= 0 or not plan.collusion or not self.distributed:
            return residual
        return residual * max(m - plan.collusion, 0) / m


class _NoNoise(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (Fraction(0),)


class _Con(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (plan.sigma / plan.guessed_survivors,)


class _Committee(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (plan.sigma / (plan.sampled - plan.tolerance),)


class _Local(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        return (plan.sigma,)

    def accounted(self, plan: RoundNoise, dropped: int) -> Fraction:
        return plan.sigma  # one client's own noise: private against anyone who sees its input alone


class _XNoise(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        n, t, s = plan.sampled, plan.tolerance, plan.sigma
        return (s / n, *(s / ((n - k + 1) * (n - k)) for k in range(1, t + 1)))

    def removed(self, plan: RoundNoise, dropped: int) -> tuple[int, ...]:
        return tuple(range(dropped + 1, plan.tolerance + 1))


class _XNoiseAppr(Strategy):
    def components(self, plan: RoundNoise) -> tuple[Fraction, ...]:
        n, t, s = plan.sampled, plan.tolerance, plan.sigma
        if t == 0:
            return (s / n,)
        return (s / n, plan.eta, *(plan.eta * 2 ** (k - 2) for k in range(2, plan.tau + 2)))

    def removed(self, plan: RoundNoise, dropped: int) -> tuple[int, ...]:
        n, t = plan.sampled, plan.tolerance
        if not t:
            return ()
        lam = (t - dropped) * plan.sigma / ((n - t) * (n - dropped))
        units = math.floor(lam / plan.eta)  # 0 .. 2^tau
        if units == 2**plan.tau:
            return tuple(range(1, plan.removable + 1))
        return tuple(k for k in range(2, plan.tau + 2) if units >> (k - 2) & 1)


class _Rebasing(Strategy):
    def residual(self, plan: RoundNoise, dropped: int) -> Fraction:
        m = plan.sampled - dropped
        return plan.rebased(m) * m


STRATEGIES: dict[str, Strategy] = {}
"""Every ``privacy.strategy``, by name (in the order scenarios and tables list them)."""


def register_strategy(strategy: Strategy) -> Strategy:
    """Make ``strategy`` a ``privacy.strategy`` (its name must be new)."""
    if strategy.name in STRATEGIES:
        raise ValueError(f"strategy {strategy.name!r} is registered already")
    STRATEGIES[strategy.name] = strategy
    return strategy


for _strategy in (
    _NoNoise("none", requires=NOTHING, enabled=False, distributed=False),
    Strategy("orig"),
    Strategy("early", early=True),
    _Con("con"),
    _XNoise("xnoise", removes=True),
    _XNoiseAppr("xnoise-appr", removes=True),
    _Rebasing("rebasing", rebasing=True),
    _Committee("committee"),
    _NoNoise("central", requires=ENCODED, distributed=False, central=True),
    _Local("local", requires=ENCODED, distributed=False),
):
    register_strategy(_strategy)


_PLUGINS: dict[str, Strategy] = {}
"""Plug-in strategies this process has built, by the name a scenario gives them."""


def strategy_named(name: str, where: str = "privacy.strategy") -> Strategy:
    """The strategy ``name`` stands for: one of :data:`STRATEGIES`, else a plug-in (:func:`plugin_strategy`)."""
    found = STRATEGIES.get(name) or _PLUGINS.get(name)
    if found is not None:
        return found
    # deferred: sim.plugins loads socket (importlib.metadata); the pure protocols import this module
    from sim.plugins import is_import_path, is_installed

    if not (is_import_path(name) or is_installed("strategy", name)):
        raise ValueError(
            f"unknown strategy {name!r}; one of {', '.join(STRATEGIES)}, an import path pkg.module:Name or an "
            "installed dropsim.strategies plug-in's name"
        )
    return plugin_strategy(name, where)


def plugin_strategy(name: str, where: str) -> Strategy:
    """The plug-in strategy ``name`` (an import path ``pkg.module:Name`` or a ``dropsim.strategies`` entry point,
    :mod:`sim.plugins`): a :class:`Strategy` subclass, built with ``name``, or a :class:`Strategy` object,
    renamed ``name``; checked against the interface (:func:`check_strategy`) once per process. Errors
    (:class:`sim.plugins.PluginError`) start with ``where``."""
    with _BUILDING:
        built = _PLUGINS.get(name)
        if built is None:
            built = _PLUGINS[name] = _build_strategy(name, where)
    return built


_BUILDING = threading.RLock()
"""Held while a plug-in strategy is built and checked (a Dask worker runs points in threads)."""


def _build_strategy(name: str, where: str) -> Strategy:
    # deferred: sim.plugins loads socket (importlib.metadata); the pure protocols import this module
    from sim.plugins import PluginError, call, resolve

    obj, ref = resolve("strategy", name, where)
    if isinstance(obj, type) and issubclass(obj, Strategy):
        strategy = call(obj, {"name": name, **_class_flags(obj)}, {}, ref.path, where)
    elif isinstance(obj, Strategy):
        strategy = dataclasses.replace(obj, name=name)
    else:
        raise PluginError(
            f"{where}: {ref.path} is {_kind(obj)}, not a strategy: a subclass of sim.dp.strategies.Strategy (or "
            "one of its objects) is expected (docs/plugins.md)"
        )
    check_strategy(strategy, f"{where}: {ref.path}")
    return strategy


def _class_flags(cls: type) -> dict[str, Any]:
    """The flags (``removes = True``, ...) a subclass sets as plain class attributes, which the dataclass
    constructor would otherwise set back to Orig's: passed to it as arguments."""
    names = {f.name for f in dataclasses.fields(Strategy)} - {"name"}
    flags: dict[str, Any] = {}
    for klass in reversed(cls.__mro__[: cls.__mro__.index(Strategy)]):
        flags.update({k: v for k, v in vars(klass).items() if k in names and not isinstance(v, dataclasses.Field)})
    return flags


def _kind(obj: object) -> str:
    return f"class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"


_PROBES = ((10, 0), (10, 5), (10, 9), (3, 1), (1, 0))
"""``(sampled, tolerance)`` of the rounds :func:`check_strategy` plans."""


def check_strategy(strategy: Strategy, where: str) -> None:
    """Raise :class:`sim.plugins.PluginError` unless ``strategy`` keeps the interface a round relies on: its
    flags are booleans and ``requires`` one of :data:`NOTHING`, :data:`ENCODED`, :data:`SECURE`; and, planned
    for a few round sizes and every dropout count, each method returns what it must (exact variances, as
    :class:`fractions.Fraction` or int, >= 0; removed indices among the removable components)."""
    # deferred: sim.plugins loads socket (importlib.metadata); the pure protocols import this module
    from sim.plugins import PluginError

    def fail(message: str) -> PluginError:
        return PluginError(f"{where}: breaks the strategy interface: {message} (docs/plugins.md)")

    if strategy.requires not in (NOTHING, ENCODED, SECURE):
        raise fail(f"requires is {strategy.requires!r}; one of {NOTHING!r}, {ENCODED!r}, {SECURE!r} is expected")
    for flag in ("enabled", "distributed", "removes", "rebasing", "central", "early"):
        if not isinstance(getattr(strategy, flag), bool):
            raise fail(f"{flag} is {getattr(strategy, flag)!r}, not True or False")
    for sampled, tolerance in _PROBES:
        _probe(_Probe(strategy.name, 1.0, sampled, tolerance, bound=strategy), strategy, fail)


def _probe(plan: RoundNoise, strategy: Strategy, fail: Callable[[str], Exception]) -> None:
    at = f"(planned for {plan.sampled} clients, tolerance {plan.tolerance})"

    def exact(value: object, what: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int | Fraction) or value < 0:
            raise fail(f"{what} returned {value!r} {at}: an exact variance >= 0 (a fractions.Fraction) is expected")

    def run(method: str, *args: int) -> Any:
        try:
            return getattr(strategy, method)(plan, *args)
        except Exception as exc:
            raise fail(f"{method} raised {type(exc).__name__}: {exc} {at}") from exc

    components = run("components")
    if not isinstance(components, tuple) or not components:
        raise fail(f"components returned {components!r} {at}: a non-empty tuple of variances is expected")
    for value in components:
        exact(value, "components")
    exact(run("server"), "server")
    for dropped in range(plan.sampled):
        if dropped <= plan.tolerance:
            removed = run("removed", dropped)
            if not isinstance(removed, tuple) or not all(
                isinstance(k, int) and 1 <= k < len(components) for k in removed
            ):
                raise fail(
                    f"removed({dropped}) returned {removed!r} {at}: a tuple of indices of removable components "
                    f"(1 to {len(components) - 1}) is expected"
                )
            if removed and not strategy.removes:
                raise fail(
                    f"removed({dropped}) returned {removed!r} {at}, but removes is False, so nothing would be "
                    "removed: set removes = True"
                )
        exact(run("residual", dropped), f"residual({dropped})")
        exact(run("accounted", dropped), f"accounted({dropped})")


@dataclass(frozen=True)
class RoundNoise:
    """The noise plan of one round for ``sampled`` clients."""

    strategy: str
    target: float
    """sigma*^2, model units."""
    sampled: int
    tolerance: int
    """T, dropped clients tolerated (a count)."""
    threshold: int = 0
    """t, the secure-aggregation threshold (for the collusion inflation; 0 when ``collusion`` is 0)."""
    collusion: int = 0
    """T_C."""
    guessed_dropout: float = 0.0
    """x of ``con``."""

    def __post_init__(self) -> None:
        n, t = self.sampled, self.tolerance
        self.spec  # noqa: B018 (a plug-in not yet built here is built now; an unknown name is an error)
        if n < 1 or not 0 <= t < n:
            raise ValueError(f"need 0 <= tolerance < sampled, got tolerance {t} of {n}")
        if self.collusion and not 0 <= self.collusion < self.threshold:
            raise ValueError(f"collusion {self.collusion} must be below the threshold {self.threshold}")

    @property
    def spec(self) -> Strategy:
        """The strategy's behaviour (:data:`STRATEGIES`, or a plug-in's)."""
        return strategy_named(self.strategy)

    @property
    def guessed_survivors(self) -> int:
        """``con``'s floor(n (1 - x)), at least 1 (a small round may have fewer clients than the guess
        leaves)."""
        return max(1, math.floor(self.sampled * (1 - self.guessed_dropout)))

    # -- components -------------------------------------------------------------------------------
    @cached_property
    def sigma(self) -> Fraction:
        """The target, inflated by t / (t - T_C) for distributed strategies."""
        s = Fraction(self.target)
        if self.collusion and self.spec.distributed:
            s *= Fraction(self.threshold, self.threshold - self.collusion)
        return s

    @cached_property
    def tau(self) -> int:
        """XNoise-Appr's tau = ceil(log2 T) (0 for T <= 1)."""
        return max(0, math.ceil(math.log2(self.tolerance))) if self.tolerance else 0

    @cached_property
    def eta(self) -> Fraction:
        """XNoise-Appr's smallest removable unit, eta = sigma^2 T / (2^tau n (n - T))."""
        n, t = self.sampled, self.tolerance
        return self.sigma * t / (2**self.tau * n * (n - t))

    @cached_property
    def components(self) -> tuple[Fraction, ...]:
        """Variance of each client component (model units); index 0 is never removed."""
        return self.spec.components(self)

    @property
    def removable(self) -> int:
        """Components that may be removed (each with its own seed, Shamir-shared)."""
        return len(self.components) - 1

    @property
    def server(self) -> Fraction:
        """Variance the server adds to the aggregate (``central``)."""
        return self.spec.server(self)

    def rebased(self, survivors: int) -> Fraction:
        """``rebasing``: the variance of the fresh noise each of ``survivors`` sends with -n_0."""
        return self.sigma / survivors

    # -- removal ----------------------------------------------------------------------------------
    def removed(self, dropped: int) -> tuple[int, ...]:
        """Indices of the components every survivor's noise loses when ``dropped`` clients dropped."""
        n, t = self.sampled, self.tolerance
        if not 0 <= dropped <= n:
            raise ValueError(f"{dropped} dropped of {n} sampled: a survivor set larger than the sample")
        if dropped > t or dropped >= n:
            return ()
        return self.spec.removed(self, dropped)

    def residual(self, dropped: int) -> Fraction:
        """Central variance left in the aggregate when ``dropped`` of the sampled clients dropped."""
        if self.sampled - dropped <= 0:
            return Fraction(0)
        return self.spec.residual(self, dropped)

    def accounted(self, dropped: int) -> Fraction:
        """The variance the round's privacy is accounted at: against the server, with the T_C colluders'
        own noise known to it (``local``: one client's own noise)."""
        return self.spec.accounted(self, dropped)

    @cached_property
    def largest_residual(self) -> Fraction:
        """The most noise the decoded aggregate can hold (over every dropout count): the range it must fit."""
        return max(self.residual(d) for d in range(self.sampled))

    @cached_property
    def added(self) -> Fraction:
        """Variance each client adds before any removal (sum of its components)."""
        return sum(self.components, Fraction(0))


@dataclass(frozen=True)
class _Probe(RoundNoise):
    """A plan of a strategy being checked (:func:`check_strategy`), which is nobody's to look up by name yet."""

    bound: Any = None

    @property
    def spec(self) -> Strategy:
        assert isinstance(self.bound, Strategy)
        return self.bound
