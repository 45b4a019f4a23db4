"""deploy/slurm/fr-otel.sbatch decides on evidence only: it resubmits only on exit 75, leaves out only this
allocation's hosts named in regular files of bounded size, carries its exclusions through Slurm's ``--export``
parsing, and gives each job its own out folder and its own secret. The real script runs under bash with Slurm's
commands played on one node (``support.slurm``); the training step is a stand-in ``fr-otel`` that exits as told
and plants what an attacker who writes the out folder would."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from support.jobs import write_executable
from support.slurm import allocation, export_environment

SBATCH = Path(__file__).resolve().parents[2] / "deploy" / "slurm" / "fr-otel.sbatch"

FAKE_FR_OTEL = """#!/bin/sh
[ "$1" = watch ] && exit 0
folder="$FR_OTEL_OUT_DIR/dumps/$SLURM_JOB_ID"
mkdir -p "$folder"
printf '%s %s\\n' "$FR_OTEL_OUT_DIR" "$FR_OTEL_JOB_SECRET" > "$FAKE_SEEN.$SLURM_JOB_ID"
case "$FAKE_PLANT" in
  list) printf 'localhost\\nnode-b\\n-x\\n$(id)\\n;touch /tmp/x\\nnode-c\\n' > "$folder/exclude-hosts.txt" ;;
  fifo) mkfifo "$folder/exclude-hosts.txt"; mkdir -p "$folder.z"; ln -s /dev/zero "$folder.z/exclude-hosts.txt" ;;
esac
exit "$FAKE_RC"
"""


def _job(tmp_path: Path, job_id: str, rc: int, plant: str, environ: dict[str, str] | None = None
         ) -> tuple[subprocess.CompletedProcess[str], float]:
    """The script as job ``job_id`` of a two-node allocation (localhost, node-b), the training exiting ``rc``."""
    fake = tmp_path / "fake-bin"
    fake.mkdir(exist_ok=True)
    (tmp_path / job_id).mkdir()
    write_executable(fake / "fr-otel", FAKE_FR_OTEL)
    base = environ if environ is not None else {k: v for k, v in os.environ.items()
                                                if not k.startswith(("FR_OTEL_", "SLURM_"))}
    env = {**base, **allocation(tmp_path / job_id, job_id=job_id), "SLURM_JOB_NODELIST": "localhost,node-b",
           "SLURM_SUBMIT_DIR": str(tmp_path), "FAKE_SBATCH_LOG": str(tmp_path / "sbatch.jsonl"),
           "FAKE_RC": str(rc), "FAKE_PLANT": plant, "FAKE_SEEN": str(tmp_path / "seen"),
           "PROMETHEUS_TARGETS_DIR": str(tmp_path / "targets"), "FR_OTEL_ON_HANG": "abort",
           "FR_OTEL_EXPORT_GRACE_S": "0"}
    env["PATH"] = os.pathsep.join([str(fake), env["PATH"]])
    began = time.monotonic()
    out = subprocess.run(["bash", str(SBATCH)], env=env, capture_output=True, text=True, timeout=60)
    return out, time.monotonic() - began


def _submitted(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "sbatch.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def test_exclusions_survive_slurm_s_export_parsing_and_each_resubmission_has_its_own_folder_and_secret(
        tmp_path: Path) -> None:
    """Job 4300 exits 75 naming both its nodes (and junk no node has): it resubmits without both. The resubmitted
    job, its environment built from that ``--export`` as Slurm splits it, still leaves out both when it exits 75
    in turn, writes into its own out folder, and signs with a secret of its own."""
    out, _ = _job(tmp_path, "4300", 75, "list")
    assert out.returncode == 75, out.stderr
    [first] = _submitted(tmp_path)
    assert first[0] == "--exclude=localhost,node-b", first
    export = next(a for a in first if a.startswith("--export="))
    env = export_environment(export.removeprefix("--export="), {**os.environ, "FR_OTEL_OUT_DIR": "/elsewhere"})
    assert env["FR_OTEL_RESUBMITS"] == "1" and "FR_OTEL_JOB_SECRET" not in export
    out, _ = _job(tmp_path, "4301", 75, "none", environ=env)
    assert out.returncode == 75, out.stderr
    second = _submitted(tmp_path)[1]
    assert second[0] == "--exclude=localhost,node-b" and "FR_OTEL_RESUBMITS=2" in second[1], second
    seen = {job: (tmp_path / f"seen.{job}").read_text().split() for job in ("4300", "4301")}
    assert [Path(seen[job][0]).name for job in ("4300", "4301")] == ["4300", "4301"], seen
    assert all(len(s[1]) == 64 for s in seen.values()) and seen["4300"][1] != seen["4301"][1], seen


@pytest.mark.parametrize("rc,plant,submitted", [(1, "list", []), (75, "fifo", [["--export=ALL,FR_OTEL_RESUBMITS=1,"
                                                                             "FR_OTEL_EXCLUDED="]])])
def test_only_exit_75_resubmits_and_a_planted_fifo_or_device_blocks_nothing(
        tmp_path: Path, rc: int, plant: str, submitted: list[list[str]]) -> None:
    """A plain crash (exit 1) with a list naming every node planted submits nothing; exit 75 with a FIFO planted as
    exclude-hosts.txt and a link to /dev/zero as another resubmits at once, leaving no host out."""
    out, took = _job(tmp_path, "4300", rc, plant)
    assert out.returncode == rc and took < 30, (took, out.stderr)
    assert [s[:-1] for s in _submitted(tmp_path)] == submitted, _submitted(tmp_path)
