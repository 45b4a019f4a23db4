"""What stays light, in one table: each path a user or a training job takes, and the heavy modules it
never loads (torch, gRPC, the OpenTelemetry SDK, prometheus_client, tqdm).

Run in a fresh interpreter each, so what the suite itself imported cannot hide a load. The static
side (the light layers never import these, not even lazily) is tests/project/test_architecture.py;
the start-up time of ``import fr_otel`` and ``--help`` is tests/cli/test_instant_start.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INCIDENT = REPO / "tests" / "data" / "nvrx-fr-traces" / "lock_gil_1st"
TORCH, GRPC, SDK, PROMETHEUS, TQDM = "torch", "grpc", "opentelemetry.sdk", "prometheus_client", "tqdm"
EVERY = (TORCH, GRPC, SDK, PROMETHEUS, TQDM)

#: (why it must stay light, the code a fresh interpreter runs, the modules it must not have loaded).
LIGHT_PATHS = {
    "import-fr_otel": ("a training script imports fr_otel and looks up fr_otel.start: nothing loads until start()",
                       "import fr_otel; fr_otel.start", EVERY),
    "import-cli": ("the CLI's entry point", "import fr_otel.cli", EVERY),
    "import-reader": ("reading dumps", "import fr_otel.read.reader", EVERY),
    "import-analysis": ("analysing them", "import fr_otel.diagnosis.analysis", EVERY),
    "import-watch": ("the watcher, before it exports", "import fr_otel.watch", EVERY),
    "import-scenarios": ("the real-hang factory: its callers (and the analyser) need no torch to import it",
                         "import fr_otel.scenarios", (TORCH,)),
    "analyze-json": ("`fr-otel analyze --json` answers without the SDK, gRPC or torch",
                     f"from fr_otel.cli import main; assert main(['analyze', {str(INCIDENT)!r}, '--json', '-q']) == 0",
                     (TORCH, GRPC, SDK, PROMETHEUS)),
    "hidden-bar": ("a progress bar that is not shown (a pipe, --quiet) never imports tqdm",
                   "from fr_otel.common import progress\n"
                   "with progress.TerminalProgress(enabled=False).task('x', 'y') as update:\n    update(1, 2)",
                   (TQDM,)),
}


def loaded(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter holds after running ``code`` (stdout kept clean of the code's own)."""
    probe = ("import io, contextlib, sys\nwith contextlib.redirect_stdout(io.StringIO()):\n"
             + "".join(f"    {line}\n" for line in code.splitlines())
             + f"import json\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", LIGHT_PATHS)
def test_each_light_path_loads_none_of_its_heavy_modules(path: str) -> None:
    """The table's row: its code, run alone, leaves none of the row's heavy modules in sys.modules."""
    _, code, heavy = LIGHT_PATHS[path]
    assert loaded(code, heavy) == []


def test_the_probe_sees_a_heavy_module_load() -> None:
    """The check can fail: code that imports tqdm (or the SDK) is reported as loading it."""
    assert loaded("import tqdm", EVERY) == [TQDM]
    assert loaded("import opentelemetry.sdk.trace", (GRPC, SDK)) == [SDK]


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
