"""Every file fr-otel writes: regular files only, replaced atomically, never a device or a FIFO.

Reports, traces, spools, dump copies and the watcher's state go to paths users (or
whoever can write the folder) choose. Writing there must never turn ``/dev/full`` into
a regular file, block forever on a FIFO, or leave half a file behind: so a path that
exists must be a regular file, and the new content goes to a temporary file in the same
folder (created ``O_EXCL | O_NOFOLLOW``) that is then renamed over it, so readers see the
old file or the new one, never a mix.

Symbolic links: most files fr-otel writes have names it picks, in folders it does not own
(``incident.json``, ``incident.html``, ``ranks.json``, ``steps.json`` and the agent's dumps
beside the dumps, the watcher's state, traces and spools under ``--out``). Anyone who can
write there can plant ``incident.html -> ~/.bashrc``; so by default a link at the name is
*replaced* by the new regular file (rename swaps the directory entry, never opening the
link), its target left untouched, with one warning. Only a path a person named for this
one output (``-o``, ``--html``) is followed to its target (``follow_links=True``).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from .log import logger
from .text import printable

__all__ = ["FileTooLarge", "NotRegularFile", "OutputRefused", "atomic_write", "open_regular", "read_regular", "check_output_dir", "check_output_file", "file_kind", "new_file_mode",
           "own_folder"]

_log = logger("fr_otel.files")


class OutputRefused(OSError):
    """The output path exists and is not what fr-otel may write (a device, FIFO, directory...)."""


class NotRegularFile(OSError):
    """What is at an input path is not a regular file (a FIFO, a device, a folder...): ``kind`` says which."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(f"{path}: not a regular file ({kind})")
        self.kind = kind


class FileTooLarge(OSError):
    """An input file is over its reader's byte limit."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path}: over {limit} bytes")
        self.size, self.limit = size, limit


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> tuple[int, os.stat_result]:
    """The one way fr-otel opens a file it did not write (dumps, side files, state, node files): a
    descriptor and its ``fstat``. ``O_NONBLOCK`` so a FIFO planted at the path cannot block us until
    a writer comes; checked a regular file once open (:class:`NotRegularFile`, descriptor closed), so
    a device (``/dev/zero``: endless) is never read; ``follow_links=False`` refuses a link (ELOOP)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow_links else getattr(os, "O_NOFOLLOW", 0))
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(os.fspath(path), file_kind(st.st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, follow_links: bool = True) -> bytes:
    """A regular file's bytes (:func:`open_regular`), at most ``max_bytes``: :class:`FileTooLarge`
    beyond (read bounded, whatever the size said: a file may grow meanwhile)."""
    fd, st = open_regular(path, follow_links=follow_links)
    with open(fd, "rb") as fh:
        if st.st_size > max_bytes:
            raise FileTooLarge(os.fspath(path), st.st_size, max_bytes)
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise FileTooLarge(os.fspath(path), len(data), max_bytes)
    return data


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a device``, ``a directory``... for an ``st_mode`` (problem lines)."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def _check(path: str | os.PathLike[str], target: Path, directory: bool, folder_made: bool = False) -> Path:
    try:
        st = os.stat(target)
    except FileNotFoundError:
        if not directory and not folder_made and not target.parent.is_dir():
            raise OutputRefused(f"{path}: its folder {target.parent} does not exist") from None
        return target
    except OSError as exc:
        raise OutputRefused(exc.errno, f"{path}: cannot use as output: {exc.strerror or exc}") from None
    if (stat.S_ISDIR if directory else stat.S_ISREG)(st.st_mode):
        return target
    want = "a directory" if directory else "a regular file"
    raise OutputRefused(f"{path}: is {file_kind(st.st_mode)}, not {want}; refusing to write there")


def check_output_file(path: str | os.PathLike[str], *, folder_made: bool = False) -> Path:
    """The real path to write ``path``'s content to; raises :class:`OutputRefused` if it is not a
    regular file, or if its folder is missing (unless the caller makes it: ``folder_made``)."""
    return _check(path, Path(os.path.realpath(os.fspath(path))), directory=False, folder_made=folder_made)


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a folder to write into; raises :class:`OutputRefused` if it exists and is not a directory."""
    return _check(path, Path(path), directory=True)


def _check_entry(path: Path, folder_made: bool = False) -> bool:
    """``path`` itself (a link is not followed) may be replaced by a new regular file: it is
    missing, a regular file or a symbolic link (True: a link, to be replaced); anything else
    raises :class:`OutputRefused`."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if not folder_made and not path.parent.is_dir():
            raise OutputRefused(f"{path}: its folder {path.parent} does not exist") from None
        return False
    except OSError as exc:
        raise OutputRefused(exc.errno, f"{path}: cannot use as output: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        return True
    if not stat.S_ISREG(st.st_mode):
        raise OutputRefused(f"{path}: is {file_kind(st.st_mode)}, not a regular file; refusing to write there")
    return False


def own_folder(path: str | os.PathLike[str], mode: int = 0o777) -> Path:
    """A folder fr-otel names inside one it does not own (the agent's ``<dump dir>/<trace id>/``):
    created when missing (its parents too; itself with ``mode``, less the umask); refused
    (:class:`OutputRefused`) when what is there is a symbolic link or not a directory, so nothing
    is written into a planted folder link."""
    folder = Path(path)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, mode)
    except FileExistsError:
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
            raise OutputRefused(f"{folder}: is {kind}, not a directory; refusing to write into it") from None
    return folder


def atomic_write(path: str | os.PathLike[str], data: bytes, *, replace: bool = True, mkdir: bool = False,
                 follow_links: bool = False, mode: int | None = None, durable: bool = True) -> Path:
    """Write ``data`` as ``path`` all at once (temp file in the same folder, then rename).

    ``replace=False`` creates the file only if it does not exist (``FileExistsError``
    otherwise; file systems without hard links fall back to a plain rename). A path
    that exists must be a regular file (:class:`OutputRefused`). A symbolic link at
    ``path`` is replaced by the new file, its target untouched (one warning), unless
    ``follow_links`` (a path a person named for this output): then its target is what
    gets replaced. ``mode``: the new file's permissions (default: an existing file's, else
    what ``open()`` would give). ``durable=False`` skips the sync to disk: for a signal that means nothing
    after a crash (a heartbeat written every poll), where the sync would only cost I/O. Returns the
    path written.
    """
    if follow_links:
        target = check_output_file(path, folder_made=mkdir)
    else:
        target = Path(path)
        _check_entry(target, folder_made=mkdir)
    if mkdir:
        target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)  # O_EXCL|O_NOFOLLOW
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), _mode_for(target) if mode is None else mode)
            fh.write(data)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        if replace:
            # Not swapped for a FIFO or a folder meanwhile; a link swapped in is replaced, not followed.
            was_link = False
            if follow_links:
                check_output_file(target)
            else:
                was_link = _check_entry(target)
            os.replace(tmp_name, target)
            if was_link:
                _log.warning("%s was a symbolic link: replaced by a regular file, its target left untouched",
                             printable(str(target)))
        else:
            try:
                os.link(tmp_name, target)  # fails if someone created the file (or a link) meanwhile
            except FileExistsError:
                raise
            except OSError:  # no hard links on this file system
                if os.path.lexists(target):
                    raise FileExistsError(f"{target} exists") from None
                os.replace(tmp_name, target)
    finally:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
    return Path(path) if not (follow_links and os.path.islink(path)) else target


def _mode_for(target: Path) -> int:
    """Keep an existing regular file's permissions (never a link target's); new files get what
    ``open()`` would give them."""
    try:
        st = os.lstat(target)
        if stat.S_ISREG(st.st_mode):
            return st.st_mode & 0o777
    except OSError:
        pass
    return 0o666 & ~_umask()


def new_file_mode() -> int:
    """The permissions ``open()`` gives a new file here (0o666 less the umask): a file fr-otel writes for what
    others sent keeps no planted file's mode."""
    return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would, racing other threads)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022
