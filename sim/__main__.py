"""``python -m sim`` is the ``dropsim`` command."""

import sys

from sim.cli import main

sys.exit(main())
