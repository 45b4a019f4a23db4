"""The exit statuses of every ``fr-otel`` command, and what ``fr-otel --help`` says of them.

A module of their own (no imports) so that ``fr-otel --help`` and ``--version`` can name
them without loading the helpers that analyse or export (:mod:`._common` re-exports them).
"""

__all__ = ["EXIT_FAILED", "EXIT_LOST", "EXIT_NOT_DELIVERED", "EXIT_OK", "EXIT_STATUS_HELP", "EXIT_UNUSABLE"]

EXIT_OK = 0  # analysed, whatever the verdict
EXIT_FAILED = 1  # the command could not do its job (e.g. the demo's torch job failed)
EXIT_UNUSABLE = 2  # no usable dump, bad configuration or bad usage
EXIT_NOT_DELIVERED = 3  # analysed, but the trace is spooled (collector down or refusing) or partly rejected
EXIT_LOST = 4  # analysed, but (some of) the trace is lost: neither delivered, written nor spooled (full --out)

#: What each exit status means, for ``fr-otel --help`` (README says the same).
EXIT_STATUS_HELP = (
    "exit status: 0 done (analysed, whatever the verdict; the trace delivered or written); "
    "1 the command could not do its job (e.g. the HTML report could not be written); "
    "2 no usable dump, bad usage or bad configuration; "
    "3 the trace is spooled for `fr-otel replay` (collector down or refusing) or partly rejected by the collector; "
    "4 the trace is lost: neither delivered, written nor spooled (a full or read-only --out)."
)
