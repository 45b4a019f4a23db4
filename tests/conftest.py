"""Shared test helpers: where the real fixtures live, and running the CLI for real."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

from support.jobs import Job

# The checkout is the user's: the session fails, naming them, if tests leave paths in it.
pytest_plugins = ["support.checkout_guard"]

try:  # hypothesis keeps its example database and constants cache under a temporary home, not ./.hypothesis
    from hypothesis import settings
    from hypothesis.configuration import set_hypothesis_home_dir
except ImportError:  # pragma: no cover - the test extra installs it
    pass
else:
    _HYPOTHESIS_HOME = tempfile.TemporaryDirectory(prefix="fr-otel-hypothesis-")
    set_hypothesis_home_dir(_HYPOTHESIS_HOME.name)
    settings.register_profile("fr-otel", database=None)
    settings.load_profile("fr-otel")

REPO = Path(__file__).resolve().parents[1]
NVRX_FIXTURES = REPO / "tests" / "data" / "nvrx-fr-traces"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first, for pytest-xdist (``scripts/test.sh`` runs ``-n auto``): the lab's tests, then the
    other real jobs, then the rest, so no worker starts the longest chain last. The lab's tests share
    one xdist group, one after another on one worker: each makes 3 hosts and 6 ranks, and two labs at
    once only slow each other past the bounds they assert."""
    def tier(item: pytest.Item) -> int:
        return 0 if item.get_closest_marker("lab") else 1 if item.get_closest_marker("gloo") else 2

    items.sort(key=tier)  # stable: each tier keeps the collection order
    for item in items:
        if item.get_closest_marker("lab") is not None:
            item.add_marker(pytest.mark.xdist_group("lab"))
            _group_in_node_id(item, "lab")


def _group_in_node_id(item: pytest.Item, group: str) -> None:
    """Put ``@group`` in the test's node id, which is all xdist's loadgroup scheduler reads. xdist 3.8
    does it by setting ``item._nodeid``, which pytest 9.2 no longer reads (its ids are ``item._id``):
    do it here until xdist follows (tests/project/test_suite_scheduling.py fails if the group is lost)."""
    if "@" in item.nodeid:
        return
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # an older pytest: xdist's own ``_nodeid`` suffix works there
        return
    item._id = coerce_node_id(f"{item.nodeid}@{group}")  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def nvrx() -> Path:
    """The real 16-rank NCCL dumps, vendored with their licence (tests/data/nvrx-fr-traces)."""
    return NVRX_FIXTURES


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def run_cli():
    """Run ``fr-otel`` as a user would (a fresh interpreter), capturing its output."""
    return _run_cli


@pytest.fixture
def job_folder(tmp_path: Path) -> Path:
    """The small 4-rank NCCL-shaped hang of ``support.hostile_dumps`` (rank 3 never enqueues), as pickles."""
    from support.hostile_dumps import write_job

    return write_job(tmp_path / "dumps")


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Jobs a test starts (``support.jobs.Job``): each is ended whole (launcher, session, ranks) at the end."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


_scenario_cache: dict[str, Path] = {}


@pytest.fixture(scope="session")
def scenario_dumps(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Run a real gloo hang scenario once per session; returns its dump folder (pickle/, json/)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("real gloo jobs need the torch extra")
    from fr_otel.scenarios import make_dumps

    def get(name: str) -> Path:
        if name not in _scenario_cache:
            _scenario_cache[name] = make_dumps(name, tmp_path_factory.mktemp(name), timeout_s=120)
        return _scenario_cache[name]

    return get
