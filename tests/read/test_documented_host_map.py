"""The rank -> host map that docs/files.md tells users to write for dumps without hosts works as documented."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "files.md"


def _documented_command() -> list[str]:
    """The one-line ``python3 -c ... > DUMP_DIR/ranks.json`` of the doc, as argv (output redirect dropped)."""
    (line,) = [t for t in DOC.read_text(encoding="utf-8").splitlines() if t.startswith("python3 -c ")]
    words = shlex.split(line.split(" > ", 1)[0])
    return [sys.executable, *words[1:]]


def test_the_documented_host_map_names_the_culprits_hosts_in_real_nccl_dumps(nvrx: Path, tmp_path: Path,
                                                                               run_cli) -> None:
    """The doc's one-liner (8 ranks per host, node01 then node02) beside the real lock_gil_2nd dumps, which
    carry no host: the culprits 10 and 15 are on node02, and the verdict groups them as one node."""
    dumps = tmp_path / "dumps"
    shutil.copytree(nvrx / "lock_gil_2nd", dumps)
    before = json.loads(run_cli("analyze", str(dumps), "--json").stdout)
    assert [c["host"] for c in before["culprits"]] == [None, None]

    argv = _documented_command()
    assert argv[-3:] == ["8", "node01", "node02"]
    made = subprocess.run(argv, capture_output=True, text=True, check=True)
    (dumps / "ranks.json").write_text(made.stdout)
    assert set(json.loads(made.stdout)["ranks"]) == {str(r) for r in range(16)}

    proc = run_cli("analyze", str(dumps), "--json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert [(c["rank"], c["host"]) for c in verdict["culprits"]] == [(10, "node02"), (15, "node02")]
    assert verdict["nodes"] == [{"host": "node02", "ranks": [10, 15]}] and verdict["problems"] == []
    text = run_cli("analyze", str(dumps)).stdout
    assert re.search(r"node02: ranks 10,15 — look at the node", text)
