#!/usr/bin/env python3
"""How long ``fr-otel --version`` and ``fr-otel --help`` take over a bare interpreter.

Each command runs as a fresh process, interleaved with ``python -c pass`` (the order rotates
every round) so a loaded machine hits all alike; the bytecode is compiled first and used, as in
an installed package. Printed: each command's median wall time and CPU time (user + system, from
``wait4``: what a loaded machine inflates least), and its overhead over the bare interpreter, the
median of the per-round differences (target <= 30 ms, issue 27), and which fr_otel modules
``--version`` imported. ``--baseline-src DIR`` also runs the commands from another checkout's
``src`` (before/after in one run). A benchmark: it prints numbers and sets no gate.

    python bench/bench_start.py                # 41 rounds
    python bench/bench_start.py --rounds 101 --baseline-src /tmp/base/src
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_MS = 30.0
SRC = Path(__file__).resolve().parent.parent / "src"

#: The console script's own code (``fr-otel`` is this, written by pip), run with this checkout's src.
CONSOLE = "import sys; from fr_otel.cli import main; sys.exit(main())"
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "fr-otel --version": [sys.executable, "-c", CONSOLE, "--version"],
    "fr-otel --help": [sys.executable, "-c", CONSOLE, "--help"],
    "import fr_otel": [sys.executable, "-c", "import fr_otel"],
}


def _env(src: Path = SRC) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    env["PYTHONPATH"] = str(src)
    return env


def _time(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=41, help="runs of each command (default: %(default)s)")
    ap.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                    help="also run the fr-otel commands from this src (e.g. main before a change)")
    args = ap.parse_args(argv)
    sources = {"": SRC, **({"base ": args.baseline_src.resolve()} if args.baseline_src else {})}
    runs = {f"{tag}{name}": (cmd, _env(src)) for tag, src in sources.items() for name, cmd in COMMANDS.items()
            if not (tag and name == "python -c pass")}
    for src in sources.values():
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(src / "fr_otel")], env=_env(src), check=True,
                       capture_output=True)
    names = list(runs)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for i in range(args.rounds + 2):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            t = _time(*runs[name])
            if i >= 2:  # two warm-up rounds: page cache, pyc files
                times[name].append(t)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    base = times["python -c pass"]
    print(f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {load} at the end, python {sys.version.split()[0]}")
    print(f"{'command':<25} {'wall ms':>8} {'over bare':>10} {'CPU ms':>8} {'over bare':>10}")
    for name in names:
        wall = statistics.median(w for w, _ in times[name]) * 1e3
        cpu = statistics.median(c for _, c in times[name]) * 1e3
        if name == "python -c pass":
            print(f"{name:<25} {wall:8.1f} {'':>10} {cpu:8.1f}")
            continue
        over = statistics.median(a[0] - b[0] for a, b in zip(times[name], base)) * 1e3
        over_cpu = statistics.median(a[1] - b[1] for a, b in zip(times[name], base)) * 1e3
        verdict = ("" if "import" in name or name.startswith("base") else
                   f"  (target <= {TARGET_MS:.0f}) {'MET' if over <= TARGET_MS else 'MISSED'}")
        print(f"{name:<25} {wall:8.1f} {over:10.1f} {cpu:8.1f} {over_cpu:10.1f}{verdict}")
    probe = ("import sys, io, contextlib\nfrom fr_otel.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    try: main(['--version'])\n"
             "    except SystemExit: pass\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('fr_otel'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], env=_env(), capture_output=True, text=True, check=True)
    print(f"fr_otel modules --version imports: {loaded.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
