"""``python -m tools.upstream``: see :mod:`.cli`."""

import sys

from .cli import main

sys.exit(main())
