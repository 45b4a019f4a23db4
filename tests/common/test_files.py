"""Files written into folders fr-otel does not own never write through a planted link."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from fr_otel.common.files import OutputRefused, atomic_write, own_folder


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A file elsewhere that a planted link points at (its content and mode must survive)."""
    path = tmp_path / "elsewhere" / "victim"
    path.parent.mkdir()
    path.write_text("precious\n")
    path.chmod(0o600)
    return path


def test_a_link_at_the_name_is_replaced_and_its_target_kept(tmp_path: Path, victim: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The default: rename swaps the link for a regular file; the target is untouched; one warning."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "incident.json").symlink_to(victim)
    caplog.set_level(logging.WARNING, logger="fr_otel.files")
    atomic_write(folder / "incident.json", b"{}")
    assert not (folder / "incident.json").is_symlink() and (folder / "incident.json").read_bytes() == b"{}"
    assert victim.read_text() == "precious\n" and victim.stat().st_mode & 0o777 == 0o600
    assert [r.getMessage() for r in caplog.records] == [
        f"{folder / 'incident.json'} was a symbolic link: replaced by a regular file, its target left untouched"]


@pytest.mark.parametrize("replace", [True, False])
def test_a_dangling_or_looping_link_is_replaced_too(tmp_path: Path, replace: bool) -> None:
    """A link to nowhere (which open(O_CREAT) would create at its target) or to itself is replaced."""
    for name, target in (("a", "/nonexistent/created-through-the-link"), ("b", "b")):
        (tmp_path / name).symlink_to(target)
        if replace:
            atomic_write(tmp_path / name, b"x")
            assert (tmp_path / name).read_bytes() == b"x" and not (tmp_path / name).is_symlink()
        else:
            with pytest.raises(FileExistsError):
                atomic_write(tmp_path / name, b"x", replace=False)
    assert not Path("/nonexistent").exists()


def test_a_path_a_person_named_is_followed(tmp_path: Path, victim: Path) -> None:
    """-o/--html (follow_links=True) keep the documented behaviour: the link's target is replaced."""
    link = tmp_path / "report.html"
    link.symlink_to(victim)
    atomic_write(link, b"page", follow_links=True)
    assert link.is_symlink() and victim.read_bytes() == b"page"


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_folder_at_the_name_is_refused_untouched(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ranks.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(OutputRefused, match="not a regular file"):
        atomic_write(path, b"{}")
    assert path.is_fifo() if kind == "fifo" else path.is_dir()


def test_a_planted_folder_link_is_refused_as_an_own_folder(tmp_path: Path, victim: Path) -> None:
    """The agent's <dump dir>/<trace id>/ is made by fr-otel: a link planted there is refused, so
    nothing is written into the folder it points at."""
    root = tmp_path / "dumps"
    root.mkdir()
    (root / "trace").symlink_to(victim.parent)
    with pytest.raises(OutputRefused, match="is a symbolic link, not a directory"):
        own_folder(root / "trace")
    assert sorted(p.name for p in victim.parent.iterdir()) == ["victim"]
    assert own_folder(root / "new" / "trace").is_dir() and own_folder(root / "new" / "trace").is_dir()
