"""Whether a folder lives on a file system other machines share (NFS, Lustre, ...).

``fr-otel watch`` runs beside the job; when the dump folder is on a local disk every dump in
it was written on this machine, so the watcher may name this host as theirs. On a shared
file system the dumps may come from any node, and it must not. Decided from the mount table
(``/proc/mounts``): the longest mount point that contains the folder gives its type.
"""

from __future__ import annotations

import os

__all__ = ["SHARED_FS_TYPES", "is_shared_filesystem"]

#: File system types whose files other machines write too (``fuse.*`` counts as shared:
#: sshfs, gcsfuse, s3fs, juicefs and the like mount remote storage).
SHARED_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "cephfs", "9p", "glusterfs",
    "afs", "ocfs2", "gfs2", "orangefs", "pvfs2", "wekafs", "virtiofs", "davfs", "panfs", "quobyte", "fuse",
})


def is_shared_filesystem(path: str | os.PathLike[str], mounts: str | None = None) -> bool | None:
    """True on a shared (network/cluster) file system, False on a local one, None when the mount
    table cannot be read. ``mounts``: the table's text (default: ``/proc/mounts``)."""
    if mounts is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as fh:
                mounts = fh.read()
        except OSError:
            return None
    where = os.path.realpath(os.fspath(path))
    best, fs_type = -1, None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # later lines mount over earlier ones at the same point
            best, fs_type = len(point), fields[2]
    if fs_type is None:
        return None
    return fs_type in SHARED_FS_TYPES or fs_type.startswith("fuse.")


def _unescape(field: str) -> str:
    """Mount points escape space, tab, newline and backslash as octal (``\\040``)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field
