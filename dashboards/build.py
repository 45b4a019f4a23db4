#!/usr/bin/env python3
"""Write fr-otel's Grafana dashboards from code (grafana-foundation-sdk, the test extra).

    python dashboards/build.py          # (re)write dashboards/*.json
    python dashboards/build.py --check  # exit 1 if a dashboard file is missing, stale or left over

Exit 2, with one line saying what to install, when it cannot build: grafana-foundation-sdk missing
or not the build pyproject.toml pins.

The JSON files are committed (Grafana's file provisioning and deploy/kubernetes/generate.py read
them); never edit them by hand: change dashboards/fr_dashboards/ and run this script, then
`python deploy/kubernetes/generate.py`. The test suite fails when they differ from a fresh build.
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent
PYPROJECT = HERE.parent / "pyproject.toml"
SDK = "grafana-foundation-sdk"
if str(HERE) not in sys.path:  # fr_dashboards sits beside this script
    sys.path.insert(0, str(HERE))

try:
    from fr_dashboards import infra, overview, rank
    from fr_dashboards.board import render as render_board
except ModuleNotFoundError as exc:  # the SDK, or fr_otel (for the span attribute names), is not installed
    missing = {"grafana_foundation_sdk": "grafana-foundation-sdk", "fr_otel": "fr-otel"}.get(
        (exc.name or "").split(".")[0])
    if missing is None:
        raise
    print(f"dashboards/build.py: {missing} is not installed: pip install -e '.[test]'", file=sys.stderr)
    raise SystemExit(2) from None  # 2: cannot build; 1 (--check): built, and the files differ

BOARDS = (overview, rank, infra)


def pinned_sdk(pyproject: Path = PYPROJECT) -> str:
    """The SDK version pyproject.toml pins (one home for the pin: the test extra)."""
    extras = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for requirement in (r for group in extras.values() for r in group):
        if m := re.match(rf"{SDK}\s*==\s*([^;\s]+)", requirement):
            return m.group(1)
    raise LookupError(f"{pyproject.name} pins no {SDK}")


def sdk_problem(installed: str | None = None, pyproject: Path = PYPROJECT) -> str | None:
    """Why the installed SDK would not build what is committed (another build of it writes other
    defaults), or None. Each Grafana branch is its own epoch: an unpinned install takes the 10.1 types."""
    try:
        want = pinned_sdk(pyproject)
    except (OSError, LookupError, tomllib.TOMLDecodeError) as exc:  # KeyError is a LookupError
        return f"dashboards/build.py: cannot read the {SDK} pin from {pyproject}: {exc}"
    have = installed if installed is not None else metadata.version(SDK)
    if have == want:
        return None
    return f"dashboards/build.py: needs {SDK}=={want} (pyproject.toml), found {have}: pip install -e '.[test]'"


def render() -> dict[str, str]:
    """Every dashboard file: name (its uid) -> JSON text."""
    return {f"{module.UID}.json": render_board(module.build()) for module in BOARDS}


def stale(out_dir: Path = HERE) -> list[str]:
    """Dashboard files that are missing, differ from a fresh build, or are not built at all."""
    expected = render()
    problems = [name for name, text in expected.items()
                if not (out_dir / name).is_file() or (out_dir / name).read_text(encoding="utf-8") != text]
    return problems + [p.name for p in sorted(out_dir.glob("*.json")) if p.name not in expected]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that the dashboard files are up to date")
    args = parser.parse_args(argv)
    if problem := sdk_problem():
        print(problem, file=sys.stderr)
        return 2
    if args.check:
        problems = stale()
        for name in problems:
            print(f"out of date: dashboards/{name}", file=sys.stderr)
        if problems:
            print("run: python dashboards/build.py", file=sys.stderr)
        return 1 if problems else 0
    for name, text in render().items():
        (HERE / name).write_text(text, encoding="utf-8")
        print(f"wrote dashboards/{name}")
    print("then: python deploy/kubernetes/generate.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
