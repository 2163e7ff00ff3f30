"""Plug-ins: a user's own objects, named by import path or by an installed entry point.

A plug-in is named either by its import path, ``"pkg.module:function"`` (``"pkg.module:Class.attr"`` for an
attribute of an attribute), or by the name an installed distribution gives it in one of the entry point
groups of :data:`GROUPS` (``[project.entry-points."dropsim.models"] my-model = "pkg.module:build"``), so that
``pip install my-plugin`` makes ``my-model`` a name to use. :func:`resolve` imports it and says where it
came from (:class:`PluginRef`: the import path, and the distribution and version that provide it, for a
run's manifest); what cannot be imported is a :class:`PluginError` that names where it was named, the path
and why.

A module is looked for on ``sys.path`` and then in the working directory (as ``python -m`` would find it), so
``factory: "my_models:build"`` finds ``my_models.py`` beside where ``dropsim run`` was started. Every process
that runs a scenario (training workers, a sweep's workers, a Dask cluster's) imports its plug-ins again by
their path: they must be importable there too.

:func:`call` calls a plug-in with the scenario's ``args`` (keyword arguments), adding the values a run offers
(``input_shape``, ``num_classes``, ``population``, ``seed``) that the plug-in names among its parameters.

Importing runs the plug-in's module: a plug-in is code its user chose to run (docs/security.md).
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import inspect
import keyword
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from sim.errors import InputError

GROUPS = {
    "model": "dropsim.models",
    "dataset": "dropsim.datasets",
    "dropout": "dropsim.dropout",
    "strategy": "dropsim.strategies",
}
"""Kind of plug-in -> the entry point group installed distributions name theirs in."""


class PluginError(InputError):
    """A plug-in that cannot be used: where it was named, its import path, and why."""


@dataclass(frozen=True)
class PluginRef:
    """Where a plug-in came from."""

    kind: str
    """``model``, ``dataset``, ``dropout`` or ``strategy`` (:data:`GROUPS`)."""
    name: str
    """As the scenario names it: an import path, or an entry point's name."""
    path: str
    """Its import path, ``pkg.module:attr``."""
    distribution: str | None
    """The installed distribution that provides its module (None: a module on ``sys.path`` only)."""
    version: str | None
    module_sha256: str | None = field(default=None, compare=False)
    """SHA-256 of its module's file when it was resolved (None: a module without a file): a run made with
    other code is not the same run (:func:`sim.runner.run.prepare_output`)."""

    def record(self) -> dict[str, str | None]:
        """What the manifest records of it."""
        return {
            "kind": self.kind,
            "name": self.name,
            "path": self.path,
            "distribution": self.distribution,
            "version": self.version,
            "module_sha256": self.module_sha256,
        }


def is_import_path(text: str) -> bool:
    """Whether ``text`` names a plug-in by import path (``module:attr``) rather than by entry point name."""
    return ":" in text


_RESOLVED: dict[tuple[str, str], tuple[Any, PluginRef]] = {}
"""Plug-ins this process has resolved, by ``(kind, name)``."""


def resolve(kind: str, name: str, where: str) -> tuple[Any, PluginRef]:
    """The object plug-in ``name`` of ``kind`` stands for, and where it came from. ``where`` (file:line and
    key) starts every error message. Resolved once per process."""
    found = _RESOLVED.get((kind, name))
    if found is None:
        obj, ref = _resolve(kind, name, where)
        found = _RESOLVED[(kind, name)] = obj, replace(ref, module_sha256=_module_digest(ref.path))
    return found


def _module_digest(path: str) -> str | None:
    module = sys.modules.get(path.partition(":")[0].strip())
    file = getattr(module, "__file__", None)
    if not file:
        return None
    try:
        return hashlib.sha256(Path(file).read_bytes()).hexdigest()
    except OSError:
        return None


def is_installed(kind: str, name: str) -> bool:
    """Whether an installed distribution names a plug-in ``name`` of ``kind`` (an entry point of its group)."""
    return any(ep.name == name for ep in metadata.entry_points(group=GROUPS[kind]))


def call(fn: Any, args: Mapping[str, Any], offered: Mapping[str, Any], what: str, where: str) -> Any:
    """``fn(**args, **those of offered that fn names as parameters)`` (``args`` win over ``offered``).

    ``what`` names the plug-in in errors (its path); an ``args`` that does not fit ``fn``'s parameters, and
    whatever ``fn`` raises, is a :class:`PluginError` starting with ``where``."""
    if not callable(fn):
        raise PluginError(f"{where}: {what} is a {type(fn).__name__}, not a function or class to call")
    kwargs = dict(args)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):  # some built-ins have none: pass args alone
        signature = None
    if signature is not None:
        named = {
            p.name
            for p in signature.parameters.values()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        }
        kwargs.update({key: value for key, value in offered.items() if key in named and key not in args})
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise PluginError(f"{where}: {what}{signature} cannot take args {dict(args)!r}: {exc}") from None
    try:
        return fn(**kwargs)
    except PluginError:
        raise
    except Exception as exc:  # the plug-in's own code failed: say what it raised, and where
        raise PluginError(f"{where}: {what} raised {type(exc).__name__}: {exc}{where_raised(exc)}") from exc


def _resolve(kind: str, name: str, where: str) -> tuple[Any, PluginRef]:
    if kind not in GROUPS:
        raise ValueError(f"unknown kind of plug-in {kind!r}; one of {', '.join(GROUPS)}")
    if is_import_path(name):
        return _load_path(name, where), _ref(kind, name, name)
    found = [ep for ep in metadata.entry_points(group=GROUPS[kind]) if ep.name == name]
    if not found:
        installed = sorted({ep.name for ep in metadata.entry_points(group=GROUPS[kind])})
        raise PluginError(
            f"{where}: {name!r} is neither an import path (pkg.module:name) nor the name of an installed plug-in "
            f"in entry point group {GROUPS[kind]} (installed: {', '.join(installed) or 'none'})"
        )
    entry = found[0]
    obj = _load_path(entry.value, f"{where} (entry point {name!r} of {GROUPS[kind]})")
    ref = _ref(kind, name, entry.value)
    if entry.dist is not None:
        ref = PluginRef(kind, name, entry.value, entry.dist.metadata["Name"], entry.dist.version)
    return obj, ref


def _load_path(path: str, where: str) -> Any:
    module_name, _, attr = path.partition(":")
    parts = [module_name.strip(), *attr.strip().split(".")]
    dotted = module_name.strip().split(".")
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in [*dotted, *parts[1:]]):
        raise PluginError(f"{where}: {path!r} is not an import path: pkg.module:name is expected")
    name = module_name.strip()
    try:
        module = _import(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):  # one the module imports
            raise PluginError(
                f"{where}: cannot import {path!r}: importing {name} raised {type(exc).__name__}: {exc}"
                f"{where_raised(exc)}"
            ) from None
        raise PluginError(
            f"{where}: cannot import {path!r}: no module named {exc.name!r} (is its package installed, or on "
            "PYTHONPATH, in every process that runs the scenario?)"
        ) from None
    except Exception as exc:  # the module's own code failed: say what it raised, and where
        raise PluginError(
            f"{where}: cannot import {path!r}: importing {name} raised {type(exc).__name__}: {exc}{where_raised(exc)}"
        ) from None
    obj: Any = module
    for k, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part):
            owner = name + "".join(f".{p}" for p in parts[1:k])
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("__")], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(f"{where}: cannot import {path!r}: {owner} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def where_raised(exc: BaseException) -> str:
    """`` (at FILE:LINE)``: where in the plug-in's code ``exc`` was raised (its traceback's last frame outside
    Python's import machinery), or ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "<frozen" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _import(module_name: str) -> Any:
    """Import ``module_name`` from ``sys.path``, else from the working directory (appended to ``sys.path``, after
    everything installed, when it holds the module's top package)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = module_name.split(".", maxsplit=1)[0]
        here = str(Path.cwd())
        if exc.name != top or here in sys.path or not _holds(Path(here), top):
            raise
    sys.path.append(here)
    importlib.invalidate_caches()
    return importlib.import_module(module_name)


def _holds(folder: Path, top: str) -> bool:
    return (folder / f"{top}.py").is_file() or (folder / top / "__init__.py").is_file()


def _ref(kind: str, name: str, path: str) -> PluginRef:
    """Where ``path``'s module comes from: the installed distribution whose files hold its top package."""
    top = path.partition(":")[0].split(".")[0]
    distributions = metadata.packages_distributions().get(top, [])
    if not distributions:
        return PluginRef(kind, name, path, None, None)
    dist = distributions[0]
    try:
        version: str | None = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = None
    return PluginRef(kind, name, path, dist, version)
