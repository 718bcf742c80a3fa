"""``python -m k3env``: the same as the ``k3env`` command."""

import sys

from k3env.cli import main

sys.exit(main())
