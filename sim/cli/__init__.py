"""The ``dropsim`` command: :func:`main` parses the command line and runs a subcommand
(:mod:`sim.cli.main`; the deployment's ``deploy``, ``worker`` and ``validate`` in :mod:`sim.cli.deploy`; ``trace``
in :mod:`sim.cli.trace`)."""

from sim.cli.main import main

__all__ = ["main"]
