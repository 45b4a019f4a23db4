"""``fr-otel watch [DIR]``: a process beside the job that waits for NCCL's dumps and exports each incident once."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from ..common.ranks import compress_ranks
from ..common.text import PrintableFormatter
from ..common.export_status import ExportStatus
from ..incident.delivery import out_dir
from ..watch import (
    DEFAULT_DEADLINE_S,
    DEFAULT_POLL_S,
    DEFAULT_SETTLE_S,
    DUMP_PREFIX_ENVS,
    STATE_NAME,
    DumpWatcher,
    WatchSettings,
    dump_location,
    parse_rank_set,
)
from ._common import (
    EXIT_LOST,
    EXIT_NOT_DELIVERED,
    EXIT_OK,
    EXIT_UNUSABLE,
    add_export_args,
    add_quiet_arg,
    count,
    error,
    export_config,
    identity_env_ok,
    non_negative_seconds,
    outputs_ok,
    seconds,
    terminal_progress,
)
from .commands import command
from .export import add_trace_args, trace_options

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "watch", help=command("watch").summary,
        description="Run beside the job (it outlives the ranks). A dump is in once it stopped changing for "
        "--settle seconds and parses; an incident is exported once every expected rank is in, or --deadline "
        f"seconds after its first dump. Exported incidents are remembered in DIR/{STATE_NAME}.",
    )
    parser.add_argument("directory", nargs="?", metavar="DIR",
                        help=f"folder NCCL dumps into (default: the folder of ${DUMP_PREFIX_ENVS[0]}, else "
                        f"${DUMP_PREFIX_ENVS[1]}, else ~/.cache/torch)")
    parser.add_argument("--prefix", metavar="NAME", help="dump file name prefix; the rest of the name is the rank "
                        "(default: the file part of those variables, else any name ending in a rank number)")
    expect = parser.add_mutually_exclusive_group()
    expect.add_argument("--world-size", type=count, metavar="N",
                        help="expect ranks 0..N-1 (default: the world size the dumps' pg_config describes)")
    expect.add_argument("--expect-ranks", metavar="RANKS",
                        help="expect these ranks, e.g. 0-7,16-23 (this node's; default: as --world-size)")
    parser.add_argument("--settle", type=non_negative_seconds, default=DEFAULT_SETTLE_S, metavar="SECONDS",
                        help="a dump is complete once unchanged this long (default: %(default)s)")
    parser.add_argument("--deadline", type=non_negative_seconds, default=DEFAULT_DEADLINE_S, metavar="SECONDS",
                        help="export what is in this long after an incident's first dump (default: %(default)s)")
    parser.add_argument("--poll", type=seconds, default=DEFAULT_POLL_S, metavar="SECONDS",
                        help="seconds between looks at the folder (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="exit after the first incident (exit status as export: "
                        "0 delivered or written, 3 spooled or partly rejected, 4 lost)")
    parser.add_argument("--state", metavar="FILE", help=f"state file (default: DIR/{STATE_NAME})")
    add_quiet_arg(parser)
    add_export_args(parser)
    add_trace_args(parser)
    parser.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> WatchSettings | None:
    directory, prefix = dump_location(args.directory, args.prefix)
    if directory.exists() and not directory.is_dir():
        error(f"{directory}: not a directory")
        return None
    expected = None
    try:
        if args.world_size is not None:
            if args.world_size < 1:
                raise ValueError(f"--world-size must be at least 1, not {args.world_size}")
            expected = frozenset(range(args.world_size))
        elif args.expect_ranks is not None:
            expected = parse_rank_set(args.expect_ranks)
        for flag, value, low in (("--settle", args.settle, 0.0), ("--deadline", args.deadline, 0.0),
                                 ("--poll", args.poll, 0.01)):
            if not value >= low:
                raise ValueError(f"{flag} must be at least {low:g}, not {value:g}")
    except ValueError as exc:
        error(str(exc))
        return None
    return WatchSettings(
        directory=directory, prefix=prefix, expected_ranks=expected, settle_s=args.settle,
        deadline_s=args.deadline, poll_s=args.poll, state_path=Path(args.state) if args.state else None,
        out_dir=args.out,
    )


def _log_to_stderr() -> None:
    """One timestamped line per event; export warnings from the library go there too."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter("%(asctime)s fr-otel watch: %(message)s", "%Y-%m-%dT%H:%M:%S%z"))
    root = logging.getLogger("fr_otel")
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("fr_otel.watch").setLevel(logging.INFO)


def run(args: argparse.Namespace) -> int:
    config = export_config(args)
    if config is None:
        return EXIT_UNUSABLE
    settings = _settings(args)
    if settings is None:
        return EXIT_UNUSABLE
    if not outputs_ok(args) or not (args.job_id or identity_env_ok()):
        return EXIT_UNUSABLE
    _log_to_stderr()
    stop = threading.Event()

    def _on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the export in progress finishes (bounded by --timeout), then the loop ends
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once

    signal.signal(signal.SIGTERM, _on_term)
    watcher = DumpWatcher(settings, config, trace_options(args), progress=terminal_progress(args))
    names = f"{settings.prefix}<rank>" if settings.prefix else "<anything><rank>"
    expect = (f"ranks {compress_ranks(settings.expected_ranks)}" if settings.expected_ranks is not None
              else "the world size in the dumps' pg_config")
    where = config.shown_target() if config.endpoint else f"OTLP JSON Lines files in {out_dir(settings.out_dir)}"
    logging.getLogger("fr_otel.watch").info(
        "watching %s for %s (expecting %s; settle %gs, deadline %gs); exporting to %s; state in %s (%d incident(s) "
        "so far)", settings.directory, names, expect, settings.settle_s, settings.deadline_s, where,
        settings.state_file, len(watcher.incidents))
    incident = watcher.run(stop, once=args.once)
    if stop.is_set():
        logging.getLogger("fr_otel.watch").info("stopping (SIGTERM)")
    if args.once and incident is not None and not incident.ok:
        return EXIT_LOST if incident.status == ExportStatus.FAILED else EXIT_NOT_DELIVERED
    return EXIT_OK
