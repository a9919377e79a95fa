"""``python -m astraflow.cli``: the same as ``python -m astraflow``."""

import sys

from . import main

sys.exit(main())
