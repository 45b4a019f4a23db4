"""One atomic writer: every file fr-otel writes goes through fr_otel.common.files, but the listed streams."""

from __future__ import annotations

import re
from pathlib import Path

import pytest


# A write in product code: a private temp-and-rename, Path.write_text/write_bytes, open() with a
# writing mode, or os.open with a writing flag. Reads are fine.
_PLAIN_WRITE = re.compile(
    r"mkstemp\(|os\.replace\(\s*tmp|\.part\{"
    r"|\.write_(?:text|bytes)\("
    r"|\bopen\((?:[^()]|\([^()]*\))*?,\s*(?:mode\s*=\s*)?[rbf]*[\"'][rbt]*[wax+]"
    r"|\.open\(\s*(?:mode\s*=\s*)?[\"'][rbt]*[wax+]"
    r"|\bos\.open\((?:[^()]|\([^()]*\))*?O_(?:WRONLY|RDWR|CREAT|APPEND)"
)


# What must not be atomic, by (file, text on the line), each with its reason.
_NOT_ATOMIC = {
    ("otlp/jsonl.py", "os.O_APPEND"):
        "--jsonl appends one line per request to a file that may already hold earlier exports",
    ("demo/job.py", 'open(plan.log, "wb")'):
        "the demo job's output (torchrun and the agents' lines), streamed by the child processes while they run",
    ("agent/hang_abort.py", 'open(mark, "a"'):
        "each rank that ends a hang appends its number to fr-otel run's mark file; several may at once",
    ("cli/run.py", 'tempfile.mkstemp(prefix="fr-otel-abort-")'):
        "fr-otel run's mark file: created empty and private for the ranks to append to, never replaced",
}


def _plain_writes(text: str) -> list[str]:
    """Each line of ``text`` that writes a file without fr_otel.common.files."""
    lines = text.splitlines()
    return [lines[text.count("\n", 0, m.start())].strip() for m in _PLAIN_WRITE.finditer(text)]


def test_one_atomic_writer_for_the_project() -> None:
    """Every file fr-otel writes goes through fr_otel.common.files.atomic_write, but the listed streams."""
    src = Path(__file__).resolve().parents[2] / "src" / "fr_otel"
    offenders = [
        f"{name}: {line}"
        for path in sorted(src.rglob("*.py"))
        if (name := path.relative_to(src).as_posix()) != "common/files.py"
        for line in _plain_writes(path.read_text(encoding="utf-8"))
        if not any(name == where and what in line for where, what in _NOT_ATOMIC)
    ]
    assert offenders == []


@pytest.mark.parametrize("code", [
    'Path(p).write_text("x")', "p.write_bytes(b)", 'open(p, "w")', 'open(p, "ab")', 'p.open("r+")',
    'open(p, mode="wb")', "open(os.path.join(a, b), 'x')", "os.open(p, os.O_WRONLY | os.O_CREAT)",
    'open(\n    p,\n    "w",\n)', "tempfile.mkstemp(dir=d)",
])
def test_the_atomic_writer_check_catches_each_plain_write(code: str) -> None:
    """The check above is not blind: every way to write a file is reported."""
    assert _plain_writes(code)


@pytest.mark.parametrize("code", [
    'open(p, "rb")', "open(p)", 'p.open("r", encoding="utf-8")', "open(fd, 'rb')",
    "os.open(p, os.O_RDONLY | os.O_NONBLOCK)", 'urllib.request.urlopen(req, timeout=t)', "self.join_open()",
])
def test_the_atomic_writer_check_lets_reads_pass(code: str) -> None:
    """Reads are not writes: opening for reading is never reported."""
    assert _plain_writes(code) == []
