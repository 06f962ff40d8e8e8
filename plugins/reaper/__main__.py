"""``python -m reaper``: the same as the ``reaper`` console script."""

import sys

from reaper.cli import main

sys.exit(main())
