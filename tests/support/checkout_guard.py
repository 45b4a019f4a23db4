"""No test writes into the checkout: a pytest plugin that compares ``git status`` before and after the session.

A test that writes beside the code (``./fr-otel-out`` from a command run without ``--out``, a
cache, a stray report) dirties a user's clone and hides its own output from the next run; tests
write only under temporary directories. Loaded by tests/conftest.py; skipped where the suite
does not run from a git checkout (an unpacked sdist).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["checkout_status", "new_paths"]

#: Written by the interpreter itself wherever it imports from, not by a test.
BYTECODE = "__pycache__"

_BEFORE = pytest.StashKey[frozenset[str]]()


def checkout_status(root: Path) -> frozenset[str] | None:
    """``git status --porcelain --ignored`` of the checkout at ``root``, a line per path; None when
    ``root`` is not the top of a git checkout (or git is missing)."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        top = subprocess.run([git, "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=60, check=False)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        done = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--ignored"], capture_output=True,
                              text=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return frozenset(line for line in done.stdout.splitlines() if line.strip())


def new_paths(before: frozenset[str], after: frozenset[str]) -> list[str]:
    """What the session added or changed in the checkout, bytecode caches aside."""
    return sorted(line[3:] for line in after - before if BYTECODE not in Path(line[3:]).parts)


def pytest_sessionstart(session: pytest.Session) -> None:
    status = checkout_status(session.config.rootpath)
    if status is not None:
        session.config.stash[_BEFORE] = status


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session, naming each path, when the tests left anything new in the checkout."""
    before = session.config.stash.get(_BEFORE, None)
    after = checkout_status(session.config.rootpath) if before is not None else None
    if before is None or after is None:
        return
    written = new_paths(before, after)
    if not written:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = ["tests wrote into the checkout (write under tmp_path instead):", *(f"  {p}" for p in written)]
    if reporter is not None:
        reporter.write_sep("=", "checkout written", red=True)
        for line in lines:
            reporter.write_line(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
