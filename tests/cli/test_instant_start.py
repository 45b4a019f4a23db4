"""`import fr_otel`, `fr-otel --version` and `fr-otel --help` load no analysis, no subcommand and no
logging: they start in the time of a bare interpreter (bench/bench_start.py measures it), and
the public API still comes from the package root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

#: What the root package and the bare CLI may import of fr_otel: the version, the command table.
LIGHT = {"fr_otel", "fr_otel.version", "fr_otel.cli", "fr_otel.cli.commands", "fr_otel.cli.exit_codes"}


def _loaded(code: str) -> tuple[set[str], set[str]]:
    """(fr_otel modules, heavy stdlib modules) a fresh interpreter holds after ``code``."""
    probe = (f"{code}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith('fr_otel')))\n"
             "print(' '.join(m for m in ('logging', 'dataclasses', 'typing', 'inspect', 'argparse', 'shutil') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ours, heavy = (proc.stdout.split("\n") + ["", ""])[:2]
    return set(ours.split()), set(heavy.split())


def _cli(*argv: str) -> str:
    return ("import io, contextlib\nfrom fr_otel.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            f"    try: main({list(argv)!r})\n    except SystemExit: pass")


def test_importing_fr_otel_loads_no_analysis_module_nor_logging() -> None:
    """`import fr_otel` binds the version and nothing else: read, diagnosis, report and logging wait for first use."""
    ours, heavy = _loaded("import fr_otel")
    assert ours == {"fr_otel", "fr_otel.version"}
    assert heavy == set()


def test_version_prints_what_argparse_printed() -> None:
    """The fast path's answer is argparse's: `fr-otel VERSION` on stdout, exit 0, anywhere among the options."""
    from fr_otel.version import __version__

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    for argv in (["--version"], ["--version", "analyze"]):
        proc = subprocess.run([sys.executable, "-m", "fr_otel.cli", *argv], capture_output=True, text=True, env=env,
                              timeout=60)
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"fr-otel {__version__}\n", ""), argv


def test_version_loads_no_analysis_and_no_subcommand() -> None:
    """`fr-otel --version` imports only the CLI's table of commands and its exit codes (not even argparse)."""
    ours, heavy = _loaded(_cli("--version"))
    assert ours <= LIGHT, sorted(ours - LIGHT)
    assert heavy == set()


def test_help_without_a_command_loads_no_subcommand_module() -> None:
    """`fr-otel --help` lists every command from the table, importing none of their modules."""
    ours, heavy = _loaded(_cli("--help"))
    assert ours <= LIGHT, sorted(ours - LIGHT)
    assert heavy == {"argparse"}


def test_help_is_laid_out_as_argparse_lays_it_out(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The top-level help, formatted without shutil, is the text argparse's own formatter gives, at any width."""
    import argparse

    from fr_otel.cli import _parser

    for columns in ("60", "100", "200"):
        monkeypatch.setenv("COLUMNS", columns)
        ours = _parser(only=None)
        theirs = _parser(only=None)
        theirs.formatter_class = argparse.HelpFormatter
        assert ours.format_help() == theirs.format_help()


def test_the_public_api_still_comes_from_the_package_root() -> None:
    """`from fr_otel import read_dumps, build_job, analyze, ...` works, and `__all__` is that API, every name resolvable."""
    import fr_otel
    import fr_otel.diagnosis.analysis as its_home
    from fr_otel import Verdict, analyze, build_job, read_dumps

    assert analyze is its_home.analyze and callable(read_dumps) and callable(build_job) and Verdict.__name__ == "Verdict"
    assert {"analyze", "build_job", "read_dumps", "start", "stop", "step", "Verdict", "__version__"} <= set(fr_otel.__all__)
    assert all(getattr(fr_otel, name) is not None for name in fr_otel.__all__)
    assert set(fr_otel.__all__) <= set(dir(fr_otel))


def test_an_unknown_name_is_an_attribute_error() -> None:
    """A misspelt name fails as attribute lookups do (hasattr works), not with an ImportError."""
    import fr_otel

    assert not hasattr(fr_otel, "analyse")


def test_library_loggers_still_get_the_null_handler() -> None:
    """The first module that logs adds the package's NullHandler (stdlib convention), which the root no longer does."""
    code = ("import logging, fr_otel.common.files\n"
            "print([type(h).__name__ for h in logging.getLogger('fr_otel').handlers])")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == "['NullHandler']"
