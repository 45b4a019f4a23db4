"""What the wheel ships: the product and the user-facing test kit, not this suite's own drivers."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Signs of a browser driver: a hand-written DevTools WebSocket client, or Playwright.
BROWSER_DRIVER_MARKS = ("Sec-WebSocket-Key", "Page.navigate", "Runtime.evaluate", "playwright")


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, bytes], str]:
    """Build the wheel from a copy of the checkout (no build output lands in the tree): its files by
    name, and what the build printed (pip -v shows the build backend's own output and warnings)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "project"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.so"))
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", str(src),
         "-w", str(root / "dist")],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = (root / "dist").glob("fr_otel-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return {name: zf.read(name) for name in zf.namelist()}, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel_files(wheel_build: tuple[dict[str, bytes], str]) -> dict[str, bytes]:
    return wheel_build[0]


def test_wheel_holds_no_browser_driver(wheel_files: dict[str, bytes]) -> None:
    """No module of the wheel drives a browser: that is test machinery of this suite (tests/)."""
    names = [n for n in wheel_files if n.endswith(".py")]
    assert "fr_otel/cli/__init__.py" in names  # the wheel really holds the package
    assert not [n for n in names if "browser" in n or "chromium" in n], names
    drivers = [n for n in names if any(m.encode() in wheel_files[n] for m in BROWSER_DRIVER_MARKS)]
    assert drivers == []


def test_wheel_ships_the_user_test_kit_but_not_the_suite(wheel_files: dict[str, bytes]) -> None:
    """Users get fr_otel.testing (receivers, dump builder, spans) and nothing else of it: the suite's
    own machinery (Prometheus launcher, training loop) and nothing of tests/ ride along."""
    tops = {n.split("/", 1)[0] for n in wheel_files}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"fr_otel"}, tops
    kit = {n.removeprefix("fr_otel/testing/") for n in wheel_files
           if n.startswith("fr_otel/testing/") and n.endswith(".py")}
    assert kit == {"__init__.py", "otlp.py", "spans.py", "dump_builder.py"}, kit  # no prometheus, train_loop...


def test_wheel_ships_the_report_stylesheet_and_script(wheel_files: dict[str, bytes]) -> None:
    """The HTML page inlines report/assets/report.css and report.js: they are package data, in the wheel as in the tree."""
    for name in ("report.css", "report.js"):
        shipped = wheel_files.get(f"fr_otel/report/assets/{name}")
        assert shipped is not None, name
        assert shipped == (REPO / "src" / "fr_otel" / "report" / "assets" / name).read_bytes()


def test_wheel_marks_the_package_typed(wheel_files: dict[str, bytes]) -> None:
    """The wheel carries py.typed (PEP 561), so a user's type checker reads fr_otel's annotations."""
    assert "fr_otel/py.typed" in wheel_files


def test_wheel_ships_the_compiled_column_scan_built_from_its_source(wheel_files: dict[str, bytes]) -> None:
    """The C scan is compiled by the wheel build (the copy holds no prebuilt .so) and shipped next to
    the Python builder it speeds up."""
    assert [n for n in wheel_files if n.startswith("fr_otel/read/_column_scan.") and n.endswith(".so")]


def test_wheel_ships_both_c_extensions(wheel_files: dict[str, bytes]) -> None:
    """The pickle key walk is compiled and shipped too, like the column scan."""
    for stem in ("_column_scan", "_pickle_keys"):
        assert [n for n in wheel_files if n.startswith(f"fr_otel/read/{stem}.") and n.endswith(".so")], stem


def test_the_build_gives_no_experimental_warning(wheel_build: tuple[dict[str, bytes], str]) -> None:
    """The C extensions are declared the stable way (setup.py's ext_modules): setuptools warns of nothing experimental."""
    log = wheel_build[1]
    assert "building 'fr_otel.read._column_scan'" in log  # the log is the build's own, verbose output
    assert "experimental" not in log.lower(), [ln for ln in log.splitlines() if "experimental" in ln.lower()]


def test_setup_stamp_covers_setup_py_and_every_c_source() -> None:
    """scripts/setup.sh reinstalls (rebuilding the extensions) when setup.py or a C source changes."""
    import re

    script = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    (stamp,) = re.findall(r'^want="\$\(cat ([^|]*)\|', script, flags=re.M)
    words = stamp.split()
    assert {"pyproject.toml", "setup.py"} <= set(words)
    covered = {p for w in words for p in REPO.glob(w)}
    assert set((REPO / "src").rglob("*.c")) <= covered


def test_contributing_layout_names_every_module_under_its_own_folder() -> None:
    """CONTRIBUTING's Layout block names each module of each package folder, in that folder's entry (docs
    cannot drift)."""
    import re

    text = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
    block = text[text.index("## Layout"):]
    block = block[block.index("src/fr_otel/"):block.index("\n```", block.index("src/fr_otel/"))]
    entries = dict(re.findall(r"^  (\w+)/\s+(.*?)(?=^  \S|\Z)", block, flags=re.M | re.S))
    missing = [
        f"{folder.name}/{module.name}"
        for folder in sorted((REPO / "src" / "fr_otel").iterdir()) if folder.is_dir() and folder.name in entries
        for module in sorted(folder.glob("*.py"))
        if not module.name.startswith("__") and folder.name != "cli"  # cli: "one module per subcommand"
        and not re.search(rf"\b{module.stem}\b", entries[folder.name])
    ]
    assert len(entries) >= 10 and missing == []
