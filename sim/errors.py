"""The root of every error about the user's input.

Scenario files, data files, cost profiles and result folders that cannot be used raise subclasses of
:class:`InputError`; each message names the file (and line, key or record), the value and what would be
accepted. The command line turns them into exit status 2 without a traceback.
"""


class InputError(ValueError):
    """Input that cannot be used, with a message that says where and why."""
