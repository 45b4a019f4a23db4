"""A test session that writes into the checkout fails, naming what it wrote (tests/support/checkout_guard.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkout_guard import checkout_status, new_paths

TESTS = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git_checkout(folder: Path) -> Path:
    """A real git checkout with one commit and an ignore file, as a user's clone has."""
    folder.mkdir()
    (folder / ".gitignore").write_text("__pycache__/\nfr-otel-out/\n")
    (folder / "README.md").write_text("a project\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "start"]):
        subprocess.run(["git", "-C", str(folder), *args], check=True, env=env, capture_output=True, timeout=60)
    return folder


def test_a_new_output_folder_and_a_changed_file_are_named_and_bytecode_is_not(tmp_path: Path) -> None:
    """An ignored ./fr-otel-out, a new file and an edited tracked file are new paths; __pycache__ is not."""
    repo = git_checkout(tmp_path / "repo")
    before = checkout_status(repo)
    assert before == frozenset()
    (repo / "fr-otel-out").mkdir()
    (repo / "fr-otel-out" / "trace.jsonl").write_text("{}\n")
    (repo / "stray.html").write_text("<p>")
    (repo / "README.md").write_text("edited\n")
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "x.pyc").write_bytes(b"")
    assert new_paths(before, checkout_status(repo) or frozenset()) == ["README.md", "fr-otel-out/", "stray.html"]


def test_a_folder_that_is_not_a_checkouts_top_is_not_guarded(tmp_path: Path) -> None:
    """No git checkout here (an unpacked sdist), or only a subfolder of one: the guard stands aside."""
    assert checkout_status(tmp_path) is None
    repo = git_checkout(tmp_path / "repo")
    (repo / "sub").mkdir()
    assert checkout_status(repo / "sub") is None


def test_a_session_whose_test_writes_into_the_checkout_fails_naming_the_path(tmp_path: Path) -> None:
    """A real pytest session with the guard: its one test passes but writes ./fr-otel-out/x, so the session fails."""
    repo = git_checkout(tmp_path / "repo")
    (repo / "test_writes.py").write_text(
        "from pathlib import Path\n\n\ndef test_it():\n"
        "    Path(__file__).with_name('fr-otel-out').mkdir()\n"
        "    Path(__file__).with_name('fr-otel-out').joinpath('x').write_text('')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "support.checkout_guard",
                          "--rootdir", str(repo), "test_writes.py"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 passed" in run.stdout and "tests wrote into the checkout" in run.stdout
    assert "  fr-otel-out/" in run.stdout.splitlines()
