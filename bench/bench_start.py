#!/usr/bin/env python3
"""How long ``fr-otel --version`` and ``fr-otel --help`` take over a bare interpreter.

Each command runs as a fresh process, interleaved with ``python -c pass`` (the order rotates
every round) so a loaded machine hits all alike; the bytecode is compiled first and used, as in
an installed package. Printed: each command's median wall time and its overhead over the bare
interpreter, the median of the per-round differences (target <= 30 ms, issue 27), and which
fr_otel modules ``--version`` imported. A benchmark: it prints numbers and sets no gate.

    python bench/bench_start.py                # 41 rounds
    python bench/bench_start.py --rounds 101
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


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(SRC) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _time(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=41, help="runs of each command (default: %(default)s)")
    args = ap.parse_args(argv)
    env = _env()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(SRC / "fr_otel")], env=env, check=True,
                   capture_output=True)
    names = list(COMMANDS)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.rounds + 2):
        order = names[i % len(names):] + names[: i % len(names)]
        for name in order:
            t = _time(COMMANDS[name], env)
            if i >= 2:  # two warm-up rounds: page cache, pyc files
                times[name].append(t)
    with open("/proc/loadavg") as fh:
        load = " ".join(fh.read().split()[:3])
    base = times["python -c pass"]
    print(f"{args.rounds} rounds, {os.cpu_count()} CPUs, load average {load}, python {sys.version.split()[0]}")
    print(f"{'command':<20} {'median ms':>10} {'over bare, ms':>14}")
    for name in names:
        med = statistics.median(times[name]) * 1e3
        if name == "python -c pass":
            print(f"{name:<20} {med:10.1f} {'':>14}")
            continue
        over = statistics.median(a - b for a, b in zip(times[name], base)) * 1e3
        verdict = "" if name.startswith("import") else f"  (target <= {TARGET_MS:.0f}) {'MET' if over <= TARGET_MS else 'MISSED'}"
        print(f"{name:<20} {med:10.1f} {over:14.1f}{verdict}")
    probe = ("import sys, io, contextlib\nfrom fr_otel.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    try: main(['--version'])\n"
             "    except SystemExit: pass\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('fr_otel'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    print(f"fr_otel modules --version imports: {loaded.stdout.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
