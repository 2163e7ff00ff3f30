"""The root of every error about the user's input, and the errors of a round that cannot be set up.

Scenario files, data files, cost profiles and result folders that cannot be used raise subclasses of
:class:`InputError`; each message names the file (and line, key or record), the value and what would be
accepted. The command line turns them into exit status 2 without a traceback.

:class:`RoundSetupError` and :class:`EncodingError` live here, at the bottom, so that every package may raise
them without importing another (:mod:`sim.dp` raises :class:`EncodingError` but must not import
:mod:`sim.protocol`); :mod:`sim.protocol.machine` and :mod:`sim.protocol.encoding` re-export them.
"""


class InputError(ValueError):
    """Input that cannot be used, with a message that says where and why."""


class RoundSetupError(ValueError):
    """Parameters with which a round cannot be run safely or at all; the round aborts with this reason."""


class EncodingError(RoundSetupError):
    """Parameters that leave no room to encode (too few bits for the number of clients)."""
