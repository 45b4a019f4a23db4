"""How scripts/test.sh spreads the suite over cores: the lab's tests run one at a time, on one worker, first.

Run for real: pytest-xdist with two workers over a throwaway test folder whose conftest takes the
suite's own collection hook (tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = f"""
import importlib.util, sys
sys.path.insert(0, {str(TESTS)!r})
spec = importlib.util.spec_from_file_location("suite_conftest", {str(TESTS / "conftest.py")!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
pytest_collection_modifyitems = suite.pytest_collection_modifyitems

def pytest_configure(config):
    config.addinivalue_line("markers", "lab: a lab test")
    config.addinivalue_line("markers", "gloo: a real job")
"""

TESTS_PY = """
import os, time
import pytest

def _note(tmp_path_factory, name):
    out = tmp_path_factory.getbasetemp().parent / "ran"
    with open(out, "a") as f:
        f.write(f"{name} {os.environ.get('PYTEST_XDIST_WORKER', '-')} {time.time()}\\n")

def test_plain_one(tmp_path_factory): _note(tmp_path_factory, "plain_one"); time.sleep(0.3)
def test_plain_two(tmp_path_factory): _note(tmp_path_factory, "plain_two"); time.sleep(0.3)

@pytest.mark.lab
def test_lab_one(tmp_path_factory): _note(tmp_path_factory, "lab_one"); time.sleep(0.3)

@pytest.mark.lab
def test_lab_two(tmp_path_factory): _note(tmp_path_factory, "lab_two"); time.sleep(0.3)
"""


def test_lab_tests_share_one_xdist_group_and_one_worker(tmp_path: Path) -> None:
    """Under ``-n 2 --dist loadgroup`` both lab tests carry the ``@lab`` group and run on the same worker
    (the suite's hook must run before xdist's own, which reads the marks: otherwise two labs start at once)."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (folder / "test_sched.py").write_text(TESTS_PY)
    base = tmp_path / "bt" / "run"
    base.parent.mkdir()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-v", f"--basetemp={base}", str(folder)], capture_output=True, text=True, timeout=240,
                          cwd=folder, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "test_lab_one@lab" in done.stdout and "test_lab_two@lab" in done.stdout, done.stdout[-3000:]
    ran = {name: worker for name, worker, _ in (line.split() for line in (base / "ran").read_text().splitlines())}
    assert ran["lab_one"] == ran["lab_two"] != "-", ran
