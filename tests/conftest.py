"""Shared test helpers: where the real fixtures live, and running the CLI for real."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NVRX_FIXTURES = REPO.parent / "shared" / "fixtures" / "nvrx-fr-traces"


@pytest.fixture(scope="session")
def nvrx() -> Path:
    """The real 16-rank NCCL dumps (../shared beside the checkout)."""
    if not NVRX_FIXTURES.is_dir():
        pytest.skip(f"real NCCL fixtures not found at {NVRX_FIXTURES} (../shared is absent)")
    return NVRX_FIXTURES


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def run_cli():
    """Run ``fr-otel`` as a user would (a fresh interpreter), capturing its output."""
    return _run_cli
