"""``python -m fr_otel.cli``: the same as the ``fr-otel`` console script."""

import sys

from . import main

sys.exit(main())
