"""A one-node Slurm for the tests: ``srun`` and ``scontrol`` stand-ins, and the allocation's variables.

No slurmd runs here, so these play Slurm's part in a real job: ``srun`` starts the tasks its
options ask for on this host, each with the variables Slurm gives a task (``SLURM_PROCID`` is the
task's rank, ``SLURM_LOCALID`` its index on the node); ``scontrol show hostnames`` lists the
allocation's nodes. Beside them, ``fr-otel`` and ``torchrun`` run this checkout's CLI and this
interpreter's torchrun (:func:`support.jobs.installed_bin`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from support.jobs import installed_bin, write_executable

__all__ = ["NODE", "allocation", "export_environment", "slurm_bin"]

#: The one node of the allocation (it resolves here: rendezvous and scrapes reach it).
NODE = "localhost"

_SRUN = '''#!{python}
"""srun on one node: the tasks its options ask for, with the variables Slurm sets per task."""
import json, os, signal, subprocess, sys

args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).partition("=")
    opts[key] = value
nodes = int(opts.get("--nodes") or os.environ.get("SLURM_JOB_NUM_NODES") or 1)
if nodes != 1:
    sys.exit(f"fake srun: one node only, asked for {{nodes}}")
ntasks = int(opts.get("--ntasks") or opts.get("--ntasks-per-node") or 1)
with open(os.environ["FAKE_SRUN_LOG"], "a") as log:
    log.write(json.dumps({{"options": opts, "command": args, "tasks": ntasks}}) + "\\n")
node = os.environ.get("SLURM_JOB_NODELIST", "{node}").split(",")[0]

def task_env(i):
    return dict(os.environ, SLURM_PROCID=str(i), SLURM_LOCALID=str(i), SLURM_NODEID="0", SLURM_NTASKS=str(ntasks),
                SLURM_NPROCS=str(ntasks), SLURM_STEP_ID=str(os.getpid()), SLURMD_NODENAME=node)

if ntasks == 1:
    os.execvpe(args[0], args, task_env(0))
procs = [subprocess.Popen(args, env=task_env(i)) for i in range(ntasks)]
signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
codes = [p.wait() for p in procs]
sys.exit(next((c for c in codes if c), 0))
'''

_SCONTROL = '''#!/bin/sh
# scontrol show hostnames LIST: one node per line (comma lists only)
[ "$1 $2" = "show hostnames" ] || {{ echo "fake scontrol: only 'show hostnames'" >&2; exit 2; }}
echo "${{3:-$SLURM_JOB_NODELIST}}" | tr , '\\n'
'''

_SBATCH = '''#!{python}
"""sbatch: nothing is queued here; the submission's arguments are logged, one JSON list a line."""
import json, os, sys

with open(os.environ["FAKE_SBATCH_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
print("Submitted batch job 4300")
'''


def slurm_bin(folder: Path) -> Path:
    """``folder`` with ``srun``, ``scontrol``, ``sbatch``, ``fr-otel`` and ``torchrun``: put it first on PATH."""
    installed_bin(folder)
    write_executable(folder / "srun", _SRUN.format(python=sys.executable, node=NODE))
    write_executable(folder / "scontrol", _SCONTROL.format())
    write_executable(folder / "sbatch", _SBATCH.format(python=sys.executable))
    return folder


def allocation(tmp: Path, job_id: str = "4242", job_name: str = "fr-otel-train") -> dict[str, str]:
    """What sbatch gives a one-node batch script, with ``srun``'s log (``FAKE_SRUN_LOG``) in ``tmp``
    and ``slurm_bin`` first on ``PATH``."""
    return {
        "PATH": os.pathsep.join([str(slurm_bin(tmp / "slurm-bin")), os.environ.get("PATH", "")]),
        "FAKE_SRUN_LOG": str(tmp / "srun.jsonl"),
        "FAKE_SBATCH_LOG": str(tmp / "sbatch.jsonl"),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": job_name,
        "SLURM_JOB_NODELIST": NODE,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_SUBMIT_DIR": str(tmp),
    }


def export_environment(argument: str, environ: dict[str, str]) -> dict[str, str]:
    """The environment sbatch gives a job for ``--export=ARGUMENT``, as Slurm documents it: a comma-separated list
    of ``ALL``/``NONE``, names (their current value) and ``NAME=value`` pairs, split on every comma."""
    env: dict[str, str] = {}
    for item in argument.split(","):
        name, eq, value = item.partition("=")
        if not eq and name == "ALL":
            env.update(environ)
        elif not eq and name in environ:
            env[name] = environ[name]
        elif eq:
            env[name] = value
    return env
