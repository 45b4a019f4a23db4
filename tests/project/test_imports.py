"""Reading and analysing dumps must stay light: no torch, and no OpenTelemetry SDK or grpc until something is exported."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["fr_otel", "fr_otel.cli", "fr_otel.read.reader", "fr_otel.diagnosis.analysis", "fr_otel.watch"])
def test_import_loads_no_heavy_dependency(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "print(sorted(m for m in ('torch', 'grpc', 'opentelemetry.sdk', 'prometheus_client') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_analyze_cli_runs_without_the_sdk(nvrx, tmp_path) -> None:
    """`fr-otel analyze` answers without ever importing the OpenTelemetry SDK or grpc."""
    code = (
        "import sys; from fr_otel.cli import main; "
        f"rc = main(['analyze', {str(nvrx / 'lock_gil_1st')!r}, '--json']); "
        "assert rc == 0; "
        "assert not any(m in sys.modules for m in ('grpc', 'opentelemetry.sdk', 'torch')), 'heavy import'"
    )
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)


def test_verdict_types_are_imported_from_their_one_home() -> None:
    """Verdict, Culprit, GroupState and the other result types come from diagnosis.verdict, never from analysis."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    imports = re.compile(r"diagnosis\.analysis import \(?([^)\n]*)")
    offenders = [
        f"{path.relative_to(root)}: {names.strip()}"
        for folder in ("src", "tests", "bench", "scripts", "docs")
        for path in sorted((root / folder).rglob("*.py")) + sorted((root / folder).rglob("*.md"))
        for names in imports.findall(path.read_text(encoding="utf-8"))
        if {n.split("#")[0].strip() for n in names.split(",")} - {"analyze", ""}
    ]
    assert offenders == []
