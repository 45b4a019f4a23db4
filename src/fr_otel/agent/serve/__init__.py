"""What the agent shows: the ``/metrics`` endpoint, the ``fr_*`` metrics, and its own health counters."""
