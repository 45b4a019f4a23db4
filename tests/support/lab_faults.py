"""Multi-node fault classes on a 3-host lab, and one run of a fault with or without fr-otel.

Each :class:`Fault` knows its truth (the host and ranks at fault) and how to inject it at a
training step; :func:`run_case` runs ``support.train_loop`` on 3 hosts x 2 ranks (gloo),
injects the fault once every rank has entered the step, and records when each process exits
(seconds after the fault), what each torchrun printed, and, under ``fr-otel run``, what the
agent logged and wrote. Processes still alive at the cap print their Python stacks (SIGUSR1)
before the lab kills them.

    python tests/support/lab_faults.py --fault partition --mode control --mode agent

measures from the command line (``--help``); tests compare with :func:`control_exit_bound`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `support` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fr_otel.testing.otlp import wait_for
from support.lab import Lab
from support.lab_job import LabJob, fr_otel_run

__all__ = ["CONTROL_EXIT", "FAULTS", "PAUSE_MARGIN_S", "CaseResult", "ControlExit", "Fault", "control_exit_bound",
           "job_env", "run_case"]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]
NPROC = 2
HOSTS = 3


@dataclass(frozen=True)
class Fault:
    """One fault class: what happens, to which host and ranks (the truth), how it is injected."""

    name: str
    what: str
    node: int
    ranks: tuple[int, ...]
    #: Injects the fault into the running job; returns its time (``time.time()``).
    inject: Callable[[Lab, LabJob], float]
    #: Extra environment of the training script (a code hang is the script's own).
    env: dict[str, str] = field(default_factory=dict)
    #: Its host's processes never exit (stopped): a run waits for every other process, not for them.
    stays: bool = False


def _code_hang(lab: Lab, job: LabJob) -> float:
    """The fault is the script's own sleep: its time is when the rank wrote ``stall_start.json``."""
    marker = job.markers / "stall_start.json"
    wait_for(lambda: marker.exists() or job.done(), timeout=180, interval=0.02)
    return float(json.loads(marker.read_text())["time"]) if marker.exists() else time.time()


FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("partition", "node1's link goes down", 1, (2, 3), lambda lab, job: lab.partition(1)),
    Fault("freeze", "every process of node2 SIGSTOPped", 2, (4, 5), lambda lab, job: lab.freeze(2), stays=True),
    Fault("crash", "node1's workers SIGKILLed", 1, (2, 3),
          lambda lab, job: (lab.crash_workers(1), lab.faults[-1][0])[1]),
    Fault("store_host", "node0 (the store's host) partitioned", 0, (0, 1), lambda lab, job: lab.partition(0)),
    Fault("code_hang", "rank 5 sleeps 300 s before its collective", 2, (5,), _code_hang,
          {"TRAIN_LOOP_STALL_RANK": "5", "TRAIN_LOOP_STALL_SECONDS": "300"}),
    Fault("slow", "node1 held to 25 % of one CPU", 1, (2, 3), lambda lab, job: (lab.slow(1, 0.25), lab.faults[-1][0])[1]),
)}


def job_env(**extra: str) -> dict[str, str]:
    """This process's environment without fr-otel, OTel or train-loop settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


@dataclass
class CaseResult:
    """One run of one fault: exits in seconds after the fault (None: still running at the cap)."""

    fault: str
    agent: bool
    cap_s: float
    fault_step: dict[int, int]
    worker_exit_s: dict[int, float | None]
    torchrun_exit: dict[str, tuple[int | None, float | None]]
    torchrun_tail: dict[str, list[str]]
    #: Each host's distinct exception lines (``...Error: ...``), first seen first.
    errors: dict[str, list[str]]
    agent_lines: list[str]
    files: list[str]
    #: Each incident.json the agents wrote: number, verdict, culprits with the host it names (or None).
    incidents: list[dict[str, object]]
    stacks: dict[str, str]
    #: The agent's lines (``fr-otel ...``) as each host's torchrun printed them.
    agent_lines_by_host: dict[str, list[str]] = field(default_factory=dict)

    def survivors_exit_s(self) -> float | None:
        """When the last rank that was not at fault exited; None if one never did."""
        times = [t for rank, t in self.worker_exit_s.items() if rank not in FAULTS[self.fault].ranks]
        return None if any(t is None for t in times) else max(times, default=0.0)  # type: ignore[type-var]


_NOISE = ("Failed to initialize NumPy", "cpu = _conversion_method_template", "hostname of the client socket")


def _tail(text: str, n: int = 12) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not any(x in line for x in _NOISE)][-n:]


def _errors(text: str, n: int = 8) -> list[str]:
    found = [line.strip()[:300] for line in text.splitlines()
             if "Error: " in line and not any(x in line for x in _NOISE)]
    return list(dict.fromkeys(found))[:n]


#: How long before the end of the fault step's pause the fault lands (see ``pause_s``).
PAUSE_MARGIN_S = 1.0


def run_case(fault: Fault, *, agent: bool, tmp: Path, gloo_timeout: float = 20, step: int = 12,
             cap_s: float = 150, steps: int = 40, stall_seconds: float = 10,
             agent_env: dict[str, str] | None = None, resolve_names: bool = True, pause_s: float = 0) -> CaseResult:
    """Run the 3x2 job, inject ``fault`` at ``step``, wait up to ``cap_s`` s after it for every exit;
    ``agent_env``: more settings of the agent (``FR_OTEL_*``); ``resolve_names`` False: the hosts' names do
    not resolve between them; ``pause_s``: step ``step``'s data loading lasts that long and the fault lands
    :data:`PAUSE_MARGIN_S` before its end, so the collective left in flight is surely that step's (with
    0.05 s steps it may be the next one's) and every node has beaten in that step before it."""
    pause = pause_s if pause_s > PAUSE_MARGIN_S and "TRAIN_LOOP_STALL_RANK" not in fault.env else 0.0
    env = job_env(TRAIN_LOOP_STEPS=str(steps), TRAIN_LOOP_STALL_STEP=str(step),
                  TRAIN_LOOP_GLOO_TIMEOUT=f"{gloo_timeout:g}", **fault.env, **(agent_env or {}),
                  **({"TRAIN_LOOP_PAUSE_STEP": str(step), "TRAIN_LOOP_PAUSE_SECONDS": f"{pause:g}"} if pause else {}))
    wrap: list[str] = []
    if agent:
        env.update(FR_OTEL_OUT_DIR=str(tmp / "{node}" / "out"), FR_OTEL_NODE_DIR=str(tmp / "{node}" / "node"))
        wrap = fr_otel_run("--stall-seconds", f"{stall_seconds:g}")
    with Lab(HOSTS, log_dir=tmp, resolve_names=resolve_names) as lab:
        job = lab.torchrun(TRAIN_LOOP, NPROC, env, wrap=wrap)
        job.wait_workers(120)
        if "TRAIN_LOOP_STALL_RANK" not in fault.env:
            entered = job.wait_step(step, 120)
            if pause and all(s.step == step for s in entered.values()):  # timed from the ranks' own markers
                began = max(s.time for s in entered.values())
                time.sleep(max(0.0, began + pause - PAUSE_MARGIN_S - time.time()))
        t0 = fault.inject(lab, job)
        at_fault = {rank: s.step for rank, s in job.steps().items()}
        wait_for(lambda: _settled(job, fault), max(0.0, cap_s - (time.time() - t0)), 0.05)
        stacks = {}
        if not job.done():
            job.stacks()
        for proc in job.launchers:
            stacks[lab.hostnames[proc.node]] = _stack_dumps(proc.stderr_path.read_text(errors="replace"))
        exits = {rank: (t - t0 if t is not None else None) for rank, t in job.worker_exit_times().items()}
        runs = {lab.hostnames[p.node]: (p.returncode, p.exit_time - t0 if p.exit_time else None)
                for p in job.launchers}
        outputs = {lab.hostnames[p.node]: p.output() for p in job.launchers}
    by_host = {host: [line for line in text.splitlines() if line.startswith("fr-otel")] for host, text in outputs.items()}
    lines = [line for host_lines in by_host.values() for line in host_lines]
    files = sorted(str(p.relative_to(tmp)) for p in tmp.glob("node*/out/**/*") if p.is_file())
    return CaseResult(fault.name, agent, cap_s, at_fault, exits, runs,
                      {host: _tail(text) for host, text in outputs.items()},
                      {host: _errors(text) for host, text in outputs.items()}, lines, files, _incidents(tmp, t0),
                      {host: text for host, text in stacks.items() if text}, by_host)


def _settled(job: LabJob, fault: Fault) -> bool:
    """Every process that can exit has: all of them, or all but the stopped host's (which never will:
    waiting for them until the cap would measure nothing and cost the cap)."""
    if not fault.stays:
        return job.done()
    exits = job.worker_exit_times()
    return (all(p.returncode is not None for p in job.launchers if p.node != fault.node)
            and all(t is not None for rank, t in exits.items() if rank not in fault.ranks))


def _incidents(tmp: Path, fault_time: float) -> list[dict[str, object]]:
    """Each incident.json the agents wrote (seconds after the fault it was written), with its host findings,
    the page's text and what its trace file's root span says of hosts and order."""
    found: list[dict[str, object]] = []
    for path in sorted(tmp.glob("node*/out/**/incident.json")):
        try:
            raw = json.loads(path.read_text())
            summary = raw.get("summary") or {}
            root = _root_span(path.parents[2] / f"fr-otel-trace-{raw.get('trace_id')}.jsonl")
            page = path.with_name("incident.html")
            found.append({
                "file": str(path.relative_to(tmp)), "incident": raw.get("incident"), "verdict": summary.get("verdict"),
                "written_s": path.stat().st_mtime - fault_time,
                "culprits": [{"rank": c.get("rank"), "kind": c.get("kind"), "host": c.get("host"),
                              "domain": (c.get("cause") or {}).get("domain")}
                             for c in summary.get("culprits", [])],
                "hosts": summary.get("hosts", []),
                "action": summary.get("action"), "exclude_hosts": summary.get("exclude_hosts"),
                "network": raw.get("network"),
                "html": page.read_text(errors="replace") if page.is_file() else "",
                "root": {k: v for k, v in root.items()
                         if k.startswith(("fr_otel.culprit", "fr_otel.first_stopped", "fr_otel.lost_hosts",
                                          "fr_otel.host_findings", "fr_otel.exclude_hosts", "fr_otel.action"))},
                "has_trace": bool(root),
            })
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            found.append({"file": str(path.relative_to(tmp)), "unreadable": repr(exc)})
    return found


def _root_span(trace_file: Path) -> dict[str, object]:
    """The ``fr_otel.incident`` span's attributes in an OTLP JSON lines file ({} if none)."""
    def value(v: dict) -> object:
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        return next(iter(v.values()), None)
    if not trace_file.is_file():
        return {}
    for line in trace_file.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    if span.get("name") == "fr_otel.incident":
                        return {a["key"]: value(a["value"]) for a in span.get("attributes", [])}
    return {}


def _stack_dumps(text: str) -> str:
    """The faulthandler blocks (``Thread 0x...`` / ``Current thread``) in a torchrun's stderr."""
    keep, out = False, []
    for line in text.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            keep = True
        elif keep and not line.startswith("  "):
            keep = line == ""
        if keep:
            out.append(line)
    return "\n".join(out)


@dataclass(frozen=True)
class ControlExit:
    """When the last surviving worker of the job without fr-otel exited, measured (tests/support/lab.md)."""

    #: True: the survivors leave on gloo's timeout (the measure is seconds past it); False: at once.
    on_timeout: bool
    #: The largest of two runs (2-core dev box, load 5-7, gloo timeout 20 s, fault at step 12).
    seconds: float


#: Per fault class; "slow" has none: that job finishes (its ranks exited 7-16 s after the fault).
CONTROL_EXIT: dict[str, ControlExit] = {
    "partition": ControlExit(True, 9.5),  # every rank, the partitioned host's too: 26.5 / 29.5 s after the fault
    "freeze": ControlExit(True, 8.4),  # ranks 0-3: 27.5 / 28.4 s; the frozen ranks never (stopped)
    "crash": ControlExit(False, 4.7),  # 3.1 / 4.7 s (connection reset / closed by peer)
    "store_host": ControlExit(True, 7.2),  # every rank, node0's too: 25.6 / 27.2 s
    "code_hang": ControlExit(True, 4.7),  # every rank, the sleeping rank 5 too (gloo timed out its peers): 24.3 / 24.7 s
}


def control_exit_bound(fault: str, gloo_timeout: float, slack_s: float = 10.0) -> float:
    """Seconds after the fault by which the no-agent job's surviving workers had all exited, plus ``slack_s``.

    The measured excess over gloo's timeout is mostly process teardown on a loaded 2-core box
    (it grew ~3 s between runs at load 5 and 7): keep the slack for CI's noise, then add the
    agent's own exit budget on top when asserting "the agent's job exits by the control's time plus its budget".
    """
    control = CONTROL_EXIT[fault]
    return (gloo_timeout if control.on_timeout else 0.0) + control.seconds + slack_s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run fault classes on a 3-host lab and print when each process exits.")
    parser.add_argument("--fault", action="append", choices=sorted(FAULTS), help="repeatable (default: all)")
    parser.add_argument("--mode", action="append", choices=["control", "agent"], help="repeatable (default: both)")
    parser.add_argument("--cap", type=float, default=150, help="seconds after the fault before killing (150)")
    parser.add_argument("--gloo-timeout", type=float, default=20)
    parser.add_argument("--json-out", type=Path, help="append one JSON line per run")
    parser.add_argument("--keep", type=Path, help="keep each run's logs and agent output under DIR/<fault>-<mode>")
    args = parser.parse_args(argv)
    for name in args.fault or list(FAULTS):
        for mode in args.mode or ["control", "agent"]:
            with tempfile.TemporaryDirectory(prefix=f"lab-{name}-{mode}-") as tmp:
                folder = args.keep / f"{name}-{mode}" if args.keep else Path(tmp)
                folder.mkdir(parents=True, exist_ok=True)
                started = time.time()
                result = run_case(FAULTS[name], agent=mode == "agent", tmp=folder, cap_s=args.cap,
                                  gloo_timeout=args.gloo_timeout)
            print(f"== {name} / {mode} ({time.time() - started:.0f} s): survivors exit at {result.survivors_exit_s()}")
            print(json.dumps(asdict(result), indent=1), flush=True)
            if args.json_out:
                with open(args.json_out, "a") as out:
                    out.write(json.dumps(asdict(result)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
