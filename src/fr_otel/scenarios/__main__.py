"""``python -m fr_otel.scenarios --scenario NAME --out DIR``: the job a scenario runs as."""

import sys

from .job import main

sys.exit(main())
