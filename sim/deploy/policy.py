"""A worker's own security policy: what it agrees to run, whatever the server's scenario asks.

The server sends the scenario (:class:`~sim.deploy.control.Config`), so a worker without a policy of its own
runs whatever the server names: FedAvg (its update in the clear), ``plain`` (its update decodable alone), a
threshold that a server can split (:mod:`sim.protocol.collusion`), no noise. A :class:`WorkerPolicy` states
what the worker accepts. It is given by ``dropsim worker``'s flags or by a policy file (:func:`read_policy`),
and checked twice, each time before the worker trains or sends anything of its own:

- the configuration (:meth:`WorkerPolicy.secrets_refusals` and :meth:`WorkerPolicy.plugin_refusals` before
  the scenario is read, then :meth:`WorkerPolicy.scenario_refusals` at the planned round size): a worker that
  refuses it says why to the server and exits, and the server counts the clients it would have played as
  dropouts (``refused: ...``);
- each round as sampled (:meth:`WorkerPolicy.round_refusals`, and the epsilon limits of
  :class:`sim.deploy.spending.Spending`): its size fixes t and the holders of this worker's secrets. A
  refused round is left before the model is downloaded, as a dropout labelled ``refused: policy: ...``.

The rules, each naming the scenario key it reads:

- ``protocols``: ``aggregation.protocol`` must be one of them (default ``secagg`` and ``secagg+``).
- ``adversary``: ``semi-honest`` takes either variant; ``malicious`` takes only ``aggregation.adversary:
  malicious`` (signed keys and the consistency check), and ``dropsim worker`` then needs every worker's
  verification key in its key folder: the server that lists the round's keys could otherwise sign as
  anyone. Under the semi-honest variant nothing stops a server that deviates from the protocol from giving
  the worker keys of its own for the other clients, and so reading its update: this policy's other rules
  defend a worker against what a server *names*, the malicious variant against what it *does*.
- ``threshold`` (a fraction f): the round's t of the holders H of this worker's secrets is at least
  ``floor(f |H|) + 1``, what ``aggregation.threshold: f`` would give.
- ``collusion`` (c, or ``none``), with c' the larger of c and the scenario's ``privacy.collusion`` (the
  default, 0, is the scenario's declared collusion):

  - t defeats a split view by a server with c' colluders among the holders, ``t > (|H| + c') / 2``
    (:func:`sim.protocol.collusion.split_view_possible`). In the malicious variant this is what the
    consistency check needs; in the semi-honest one, what a server needs to recover the worker's secrets
    by telling its holders two stories of who survived, without touching the keys.
  - ``t >= c' + 2``: a sum revealed with the fewest survivors, t, holds an input besides this worker's
    and the colluders' (a round of one client is refused).

- ``dp: required``: ``privacy.strategy`` adds noise at the clients (not ``none``, not ``central``, whose noise
  the server adds after it has seen the sum).
- ``max_epsilon_round``, ``max_epsilon_total`` and ``trust_sampling``: :mod:`sim.deploy.spending`. Only the
  clients' noise counts, so a limit refuses ``none`` and ``central`` as ``dp: required`` does.
- ``plugins``: a scenario naming plug-ins (code) is refused before it is read unless they are allowed.
- ``seeded_secrets``: secrets derived from the scenario seed (no secrecy) only if allowed.

The default policy: SecAgg or SecAgg+ at the scenario's declared collusion, no plug-ins, no seeded secrets.
It guards against what a server names, not against a server that deviates from the semi-honest variant
(``adversary: malicious`` does). ``dropsim deploy`` starts its own workers with :func:`scenario_policy`,
exactly what the scenario asks, so that a one-host run is as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sim.deploy.spending import without_client_noise
from sim.errors import InputError
from sim.protocol.collusion import colluding_holders, smallest_safe_threshold, split_view_possible
from sim.protocol.registry import PROTOCOLS, reconstruction_threshold, secret_holders, spec_of
from sim.protocol.secagg.config import share_threshold
from sim.round.privacy import nominal_sampling
from sim.scenario.plugins import written_plugins
from sim.scenario.source import parse_text
from sim.scenario.types import Scenario

SEMI_HONEST = "semi-honest"
MALICIOUS = "malicious"
ADVERSARIES = (SEMI_HONEST, MALICIOUS)
"""The adversary models a policy names, weakest first."""
DEFAULT_PROTOCOLS = ("secagg", "secagg+")
NO_RULE = "none"
"""``collusion: none``: no split-view rule (what a deployment's own workers are started with)."""

POLICY_FILE_BYTES = 64 << 10
"""Largest policy file read (a policy is a few lines)."""
POLICY_REFUSAL = "policy: "
"""How a worker's reason for refusing a configuration or a round begins (the rest names the settings)."""


class PolicyError(InputError):
    """A policy file or flag that cannot be used: names the key, the value and what is accepted."""


@dataclass(frozen=True)
class WorkerPolicy:
    """What a worker accepts (module docstring); the defaults are the safe policy."""

    protocols: tuple[str, ...] = DEFAULT_PROTOCOLS
    """``aggregation.protocol`` values accepted."""
    adversary: str = SEMI_HONEST
    """The adversary model required (``aggregation.adversary``): ``semi-honest`` (either variant) or ``malicious``."""
    threshold: float = 0.0
    """Least fraction f of the holders that t must exceed: t >= floor(f |H|) + 1 (0: no rule of its own)."""
    collusion: int | None = 0
    """Colluders the threshold must defeat at least (the scenario's ``privacy.collusion`` if larger); None: no
    split-view rule."""
    dp_required: bool = False
    """Whether the clients must add DP noise."""
    max_epsilon_round: float = math.inf
    """Most epsilon one round may cost, at its worst case."""
    max_epsilon_total: float = math.inf
    """Most epsilon the deployment may cost this worker, every round at its worst case."""
    trust_sampling: bool = False
    """Whether the epsilon limits count on the server's subsampling (:mod:`sim.deploy.spending`)."""
    plugins: bool = False
    """Whether a scenario may name plug-ins (code this worker imports and runs)."""
    seeded_secrets: bool = False
    """Whether this worker agrees to derive its secrets from the scenario seed (no secrecy)."""

    def __post_init__(self) -> None:
        problems = []
        if not self.protocols:
            problems.append("protocols: is empty; name at least one of " + ", ".join(PROTOCOLS))
        unknown = [p for p in self.protocols if p not in PROTOCOLS]
        if unknown:
            problems.append(f"protocols: {', '.join(map(repr, unknown))} unknown; one of {', '.join(PROTOCOLS)}")
        if self.adversary not in ADVERSARIES:
            problems.append(f"adversary: {self.adversary!r}; one of {', '.join(ADVERSARIES)}")
        if not 0 <= self.threshold < 1:
            problems.append(f"threshold: {self.threshold!r}; a fraction in [0, 1)")
        if self.collusion is not None and not (type(self.collusion) is int and self.collusion >= 0):
            problems.append(f"collusion: {self.collusion!r}; an integer >= 0, or {NO_RULE}")
        for name in ("max_epsilon_round", "max_epsilon_total"):
            value = getattr(self, name)
            if not value > 0:  # NaN fails too
                problems.append(f"{name}: {value!r}; a number > 0, or null for no limit")
        if problems:
            raise PolicyError("worker policy: " + "; ".join(problems))

    # -- forms ----------------------------------------------------------------------------------------------
    def as_dict(self) -> dict[str, Any]:
        """The policy as plain data (the manifest's ``worker_policy``; :func:`policy_from_mapping` reads it)."""
        out = asdict(self)
        out["protocols"] = list(self.protocols)
        out["collusion"] = NO_RULE if self.collusion is None else self.collusion
        out["dp"] = "required" if out.pop("dp_required") else "optional"
        for name in ("max_epsilon_round", "max_epsilon_total"):
            out[name] = None if math.isinf(out[name]) else out[name]
        return out

    def arguments(self) -> list[str]:
        """``dropsim worker`` flags that give a worker this policy (the whole policy, every flag written)."""
        args = ["--protocols", ",".join(self.protocols), "--adversary", self.adversary]
        args += ["--min-threshold", repr(self.threshold)]
        args += ["--collusion", NO_RULE if self.collusion is None else str(self.collusion)]
        for name in ("max_epsilon_round", "max_epsilon_total"):
            value = getattr(self, name)
            if not math.isinf(value):
                args += ["--" + name.replace("_", "-"), repr(value)]
        if self.dp_required:
            args.append("--require-dp")
        if self.trust_sampling:
            args.append("--trust-sampling")
        if self.plugins:
            args.append("--allow-plugins")
        if self.seeded_secrets:
            args.append("--seeded-secrets")
        return args

    @property
    def limits_epsilon(self) -> bool:
        return not (math.isinf(self.max_epsilon_round) and math.isinf(self.max_epsilon_total))

    # -- checks ---------------------------------------------------------------------------------------------
    def secrets_refusals(self, seeded: bool) -> list[str]:
        """Whether this policy refuses a server that asks for secrets derived from the scenario seed."""
        if seeded and not self.seeded_secrets:
            return [
                "the server asks for secrets derived from the scenario seed, which keeps nothing secret; "
                "only a worker started with --seeded-secrets agrees (policy: seeded_secrets)"
            ]
        return []

    def plugin_refusals(self, document: Any) -> list[str]:
        """Whether this policy refuses a scenario document that names plug-ins (reading it imports them)."""
        named = written_plugins(document)
        if named and not self.plugins:
            return [
                f"the scenario names plug-ins ({'; '.join(named)}): code this worker would import and run; "
                "only a worker started with --allow-plugins agrees (policy: plugins)"
            ]
        return []

    def scenario_refusals(self, scenario: Scenario) -> list[str]:
        """What of ``scenario`` this policy refuses, at its planned round size (the epsilon limits are
        :class:`sim.deploy.spending.Spending`'s)."""
        agg, refused = scenario.aggregation, []
        if agg.protocol not in self.protocols:
            refused.append(
                f"aggregation.protocol {agg.protocol}: this worker accepts {', '.join(self.protocols)} "
                "(policy: protocols)"
            )
            return refused  # nothing else of a protocol it does not run is worth saying
        if self.adversary == MALICIOUS and spec_of(agg).secure and not agg.malicious:
            refused.append(
                "aggregation.adversary semi-honest: this worker requires the malicious variant (policy: adversary)"
            )
        without = without_client_noise(scenario)
        if without and (self.dp_required or self.limits_epsilon):
            limits = "dp" if self.dp_required else "max_epsilon_round, max_epsilon_total"
            refused.append(
                f"privacy.strategy {scenario.privacy.strategy} {without}: this worker requires DP noise from the "
                f"clients, which alone bounds what it spends (policy: {limits})"
            )
            return refused
        _, n = nominal_sampling(scenario)
        return refused + self.round_refusals(scenario, n, "a planned round of")

    def collusion_assumed(self, scenario: Scenario) -> int:
        """c: the colluding clients this worker's rules assume, the larger of its own and the scenario's."""
        return max(self.collusion or 0, scenario.privacy.collusion)

    def round_refusals(self, scenario: Scenario, n: int, what: str = "a round of") -> list[str]:
        """What of a round of ``n`` sampled clients this policy refuses: its threshold (the epsilon limits are
        :class:`sim.deploy.spending.Spending`'s)."""
        agg, refused = scenario.aggregation, []
        if spec_of(agg).secure and self.collusion is not None:
            c = self.collusion_assumed(scenario)
            t = reconstruction_threshold(agg, n) if n >= 1 else 0
            if t < c + 2:  # the fewest survivors that unmask: this worker and colluders alone reveal its input
                refused.append(
                    f"sampling: {what} {n} clients can reveal a sum of {t} inputs, this worker's and {t - 1} more, "
                    f"which {c} colluding clients could all be: at least {c + 2} (policy: collusion, "
                    "privacy.collusion)"
                )
        if spec_of(agg).secure and n >= 2:
            holders, t = secret_holders(agg, n), reconstruction_threshold(agg, n)
            least = share_threshold(self.threshold, holders) if self.threshold > 0 else 0
            if t < least:
                refused.append(
                    f"aggregation.threshold {agg.threshold:g}: {what} {n} clients shares this worker's secrets "
                    f"{t} of {holders}; this worker requires at least {least} (policy: threshold {self.threshold:g})"
                )
            if self.collusion is not None:
                c = self.collusion_assumed(scenario)
                if split_view_possible(t, holders, c):
                    safe = smallest_safe_threshold(holders, c)
                    refused.append(
                        f"aggregation.threshold {agg.threshold:g}: {what} {n} clients shares this worker's secrets "
                        f"{t} of {holders}, which a server with {colluding_holders(holders, c)} colluding holders "
                        f"can split into two camps and so recover them; at least {safe} of {holders} defeats that "
                        "(policy: collusion, privacy.collusion)"
                    )
        return refused


SAFE_POLICY = WorkerPolicy()
"""The default: SecAgg or SecAgg+ at the scenario's declared collusion, no plug-ins, no seeded secrets."""


def scenario_policy(scenario: Scenario, seeded: bool = False) -> WorkerPolicy:
    """Exactly what ``scenario`` asks: the policy ``dropsim deploy`` starts its own workers with (whoever
    launches a deployment on one host chose its scenario, plug-ins included)."""
    agg = scenario.aggregation
    return WorkerPolicy(
        protocols=(agg.protocol,),
        adversary=SEMI_HONEST,  # either variant: the launcher gives the workers here their keys (the PKI)
        threshold=agg.threshold if spec_of(agg).secure else 0.0,
        collusion=None,
        dp_required=not without_client_noise(scenario),
        plugins=True,
        seeded_secrets=seeded,
    )


# -- reading ------------------------------------------------------------------------------------------------
def policy_from_mapping(data: Mapping[str, Any], where: Callable[[str], str] = lambda key: key) -> WorkerPolicy:
    """A policy from plain data (a policy file, or :meth:`WorkerPolicy.as_dict`); ``where`` names a key's
    origin for messages. Absent keys keep the safe defaults."""
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where('(file)')}: must be a mapping of policy keys, not {type(data).__name__}")
    known = {f.name for f in fields(WorkerPolicy)} - {"dp_required"} | {"dp"}
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise PolicyError(f"{where(unknown[0])}: unknown policy key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    problems: list[str] = []

    def bad(key: str, value: Any, accepted: str) -> None:
        problems.append(f"{where(key)}: {key}: {value!r}; {accepted}")

    for key, value in data.items():
        if key == "protocols":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(p, str) for p in items):
                bad(key, value, "a list of protocol names")
            else:
                values[key] = tuple(p.strip() for p in items)
        elif key == "adversary":
            if value not in ADVERSARIES:
                bad(key, value, f"one of {', '.join(ADVERSARIES)}")
            values[key] = value
        elif key == "threshold":
            if not _number(value) or not 0 <= value < 1:
                bad(key, value, "a fraction in [0, 1)")
            else:
                values[key] = float(value)
        elif key == "collusion":
            if value == NO_RULE:
                values[key] = None
            elif value == "scenario":
                values[key] = 0
            elif type(value) is int and value >= 0:
                values[key] = value
            else:
                bad(key, value, f"an integer >= 0, 'scenario' (the scenario's privacy.collusion) or '{NO_RULE}'")
        elif key == "dp":
            if value not in ("required", "optional"):
                bad(key, value, "required or optional")
            values["dp_required"] = value == "required"
        elif key in ("max_epsilon_round", "max_epsilon_total"):
            if value is None:
                values[key] = math.inf
            elif not _number(value) or not value > 0:
                bad(key, value, "a number > 0, or null for no limit")
            else:
                values[key] = float(value)
        elif key in ("plugins", "seeded_secrets", "trust_sampling"):
            if not isinstance(value, bool):
                bad(key, value, "true or false")
            values[key] = value
    if problems:
        raise PolicyError("\n".join(problems))
    return WorkerPolicy(**values)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_policy(path: Path) -> WorkerPolicy:
    """The policy in YAML file ``path`` (a mapping of the keys of :func:`policy_from_mapping`)."""
    try:
        with path.open("rb") as f:
            raw = f.read(POLICY_FILE_BYTES + 1)  # no more, whatever the file is
    except OSError as exc:
        raise PolicyError(f"--policy {path}: cannot be read: {exc.strerror or exc}") from None
    if len(raw) > POLICY_FILE_BYTES:
        raise PolicyError(f"--policy {path}: is larger than {POLICY_FILE_BYTES} bytes; a policy is a few lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(f"--policy {path}: is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        doc = parse_text(text, str(path))
    except InputError as exc:
        raise PolicyError(str(exc)) from None
    return policy_from_mapping(doc.data, lambda key: doc.origin((key,)) if key != "(file)" else str(path))


def policy_text(policy: WorkerPolicy) -> str:
    """The policy as one line of JSON (a worker's log and its message to the server)."""
    return json.dumps(policy.as_dict(), sort_keys=True)
