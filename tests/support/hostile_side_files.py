"""Hostile files beside the dumps: what someone who can write a shared dump folder can plant there.

Each maker writes one hostile ``ranks.json``, ``steps.json`` or ``incident.json`` (each a
reproduced attack) at ``folder / name``; :data:`ANY_SIDE_FILE` apply to all three names, the others
to the names they list. :func:`small_job` writes the 4-rank NCCL-shaped job they sit beside.
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from pathlib import Path

from support.hostile_dumps import WORLD, nccl_dump

__all__ = ["ANY_SIDE_FILE", "BY_NAME", "INJECTED_HOST", "SIDE_FILES", "plant", "small_job", "valid_incident"]

SIDE_FILES = ("ranks.json", "steps.json", "incident.json")
#: What an operator would run if a host name reached a printed command unquoted.
INJECTED_HOST = "node7 $(touch {marker})"

Maker = Callable[[Path], None]


def small_job(folder: Path) -> Path:
    """The 4-rank job of :mod:`hostile_dumps` as pickles (rank 3 hangs) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(WORLD):
        (folder / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(nccl_dump(rank)))
    return folder


def valid_incident(**changes: object) -> dict[str, object]:
    """An incident.json a live agent would write (its trace id agrees with job id and incident)."""
    from fr_otel.common.ids import trace_id_for

    job_id, incident = str(changes.get("job_id", "job-7")), str(changes.get("incident", "3"))
    doc: dict[str, object] = {
        "format": "fr-otel/incident/1", "job_id": job_id, "incident": incident,
        "trace_id": f"{trace_id_for(job_id, incident):032x}",
        "root_attributes": [["fr_otel.incident.number", 3]], "summary": {}, "files": {},
        "ranks": {"3": {"host": "node3", "pid": 4243}},
    }
    doc.update(changes)
    return doc


def _text(content: str | bytes) -> Maker:
    data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    return lambda path: path.write_bytes(data)


def _json(doc: object) -> Maker:
    return _text(json.dumps(doc))  # ensure_ascii: lone surrogates travel as \ud800 escapes


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _looping_link(path: Path) -> None:
    path.symlink_to(path.name)


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _ranks_doc(rank_doc: dict[str, object], key: str = "3") -> dict[str, object]:
    return {"version": 1, "ranks": {key: rank_doc}}


#: Hostile content for any of the three names: (what, maker, words its problem line holds).
ANY_SIDE_FILE: dict[str, tuple[Maker, str]] = {
    "superscript rank key": (_json(valid_incident(version=1, ranks={"²": {"host": "node2", "pid": 1, "step": 1,
                                                                          "starts": []}})), "malformed rank entr"),
    "1000 nested brackets": (_text("[" * 1000), "nested deeper than 32 levels"),
    "40 nested objects": (_text('{"a":' * 40 + "1" + "}" * 40), "nested deeper than 32 levels"),
    "fifo": (_fifo, "not a regular file (a FIFO)"),
    "directory": (_directory, "not a regular file (a directory)"),
    "looping link": (_looping_link, "cannot read: Too many levels of symbolic links"),
    "device link": (_device, "not a regular file (a device)"),
    "invalid utf-8": (_text(b'{"ranks": {"1": "\xff\xfe"}}'), "invalid JSON"),
    "not an object": (_json([1, 2, 3]), "not a JSON object"),
    "5000-digit number": (_text('{"ranks": {"1": ' + "9" * 5000 + "}}"), "a number with thousands of digits"),
}

#: Hostile content for one or two names only: name(s) -> {what: (maker, words)}.
BY_NAME: dict[str, dict[str, tuple[Maker, str]]] = {
    "ranks.json": {
        "shell in a host name": (_json(_ranks_doc({"host": INJECTED_HOST.format(marker="PWNED"), "pid": 4243})),
                                 "1 host or node name that is not a host name"),
        "lone surrogate host": (_json(_ranks_doc({"host": "node\ud800", "pid": 4243})),
                                "1 host or node name that is not a host name"),
    },
    "steps.json": {
        "fullwidth rank key": (_json({"ranks": {"３": {"step": 4, "starts": [[4, 1]]}}}), "malformed rank entr"),
    },
    "incident.json": {
        "lone surrogate job id": (_json(valid_incident(job_id="job\ud800", trace_id="0" * 31 + "1")),
                                  "trace_id is not the one its job_id and incident give"),
        "control characters in the job id": (_json(valid_incident(job_id="job\x1b]0;owned\x07\x1b[2J")),
                                             "trace_id is not the one its job_id and incident give"),
        "a job id of 300 characters": (_json(valid_incident(job_id="j" * 300)), "longer than 256 characters"),
        "20000 root attributes": (_json(valid_incident(root_attributes=[[f"fr_otel.incident.x{i}", "v" * 50]
                                                                          for i in range(20000)])),
                                  "root attributes: 19936 ignored"),
    },
}


def plant(folder: Path, name: str, maker: Maker) -> Path:
    """Write one hostile side file called ``name`` into ``folder``; its path."""
    path = folder / name
    maker(path)
    return path
