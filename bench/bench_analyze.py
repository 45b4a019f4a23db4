#!/usr/bin/env python3
"""Benchmark ``fr-otel analyze`` against PyTorch's analyzer and bare unpickling.

For each configuration (N ranks x M entries, made by ``make_scaled_dumps.py`` under
/tmp and reused), these run side by side in this one run, each as a fresh subprocess,
interleaved per repetition (the order rotates) so machine noise hits all alike:

  fr-otel       ``fr-otel analyze DIR --json`` (reads on every CPU it may use); the verdict must
                name the injected culprit and nothing else, else a loud FAIL
  fr-otel -w1   ``fr-otel analyze DIR --json --workers 1``: single-core cost
  unpickle      one process, ``pickle.load`` every file and keep them all (the floor
                for anything that must hold the dumps in Python objects)
  torch         ``python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_``
  fr-otel base  with ``--baseline-src DIR``: the same ``analyze`` from another checkout's
                ``src`` (e.g. main before a change), for a before/after ratio in one run

``--p2p`` adds pipeline send/recv to the dumps (see ``make_scaled_dumps.py``): the Megatron
shape (tensor-parallel subgroups, 4-stage pipelines, NCCL's send/recv names and counters).
``--shapes`` runs both shapes at 256 x 2000 in one run, fr-otel against the unpickle-and-drop loop
(one core), and prints their ratios side by side (issue 27: target <= 1.0x on both).

Wall time is the median of the repetitions (process start to exit, interpreter start-up
included). Peak memory is measured in one more run of each tool, apart from the timed ones:
the sampler reads /proc every 10 ms from this process, and on a 2-core machine it takes CPU
from exactly the tool that uses both cores, never from a one-core loop (it made fr-otel look
~0.1 s slower at 256 ranks). It is the peak over the process tree (so fr-otel's pool workers
count): RSS while there is one process, the sum of PSS (read every 50 ms) when there are
several (a forked worker's pages shared with its parent count once), never less than the
largest single process's ``ru_maxrss`` from ``wait4``. The dump files are read once before
timing (warm page cache). Benchmarks print numbers; they are not tests.

    python bench/bench_analyze.py --quick
    python bench/bench_analyze.py                       # 1024x2000 and 256x20000
    python bench/bench_analyze.py --config 1024x2000 --reps 5 --torch-reps 1
    python bench/bench_analyze.py --floor               # 256x2000 and 1024x2000: fr-otel / unpickle-and-drop
    python bench/bench_analyze.py --shapes --reps 11    # gloo- and Megatron-shaped 256x2000 side by side
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_scaled_dumps  # noqa: E402

from fr_otel.common.cpus import usable_cpus  # noqa: E402

DEFAULT_CONFIGS = ("1024x2000", "256x20000")
QUICK_CONFIGS = ("64x2000",)
FLOOR_CONFIGS = ("256x2000", "1024x2000")  # issue 14's floor target, side by side in one run
FLOOR_TOOLS = ("fr-otel", "unpickle-discard")
SHAPES_CONFIG = (256, 2000)  # issue 27: both dump shapes at this size, side by side
SHAPES = (("gloo-shaped", False), ("Megatron-shaped", True))  # (name, p2p)
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 2**20

TOOL_KEYS = ("fr-otel", "fr-otel-base", "fr-otel-w1", "unpickle", "unpickle-nogc", "unpickle-discard", "torch")
TARGET_TORCH_RATIO = 10.0  # fr-otel at least this many times faster than torch's analyzer
TARGET_UNPICKLE_RATIO = 1.5  # fr-otel at most this many times a bare unpickling loop that keeps the dumps
TARGET_FLOOR_RATIO = 1.0  # ... and at most this many times the floor: unpickle each file and drop it (issue 14)
TARGET_MEM_DISK = 0.6  # fr-otel peak memory at most this many times the dumps' size on disk (issue 14)

UNPICKLE_SNIPPET = r"""
import gc, os, pickle, sys
d, prefix = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else ""
if mode in ("nogc", "discard"):
    gc.disable()
names = [n for n in os.listdir(d) if n.startswith(prefix) and n[len(prefix):].isdigit()]
dumps, entries = [], 0
for n in names:
    with open(os.path.join(d, n), "rb") as f:
        dump = pickle.load(f)
    entries += len(dump.get("entries", ()))
    if mode != "discard":  # "discard": the floor of decoding alone, each dump dropped at once
        dumps.append(dump)
    del dump
print(len(names), "dumps,", entries, "entries")
"""


# --------------------------------------------------------------------------- measuring


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                out.extend(int(x) for x in fh.read().split())
        except OSError:
            pass
    return out


def _tree_pids(root: int) -> list[int]:
    pids: list[int] = []
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in pids:
            continue
        pids.append(pid)
        stack.extend(_children(pid))
    return pids


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _rss(pid)


def _tree_memory(root: int, pss: bool = True) -> tuple[int, int]:
    """(sum of RSS, memory of the tree): for one process its RSS; for several the sum of
    their PSS (0 unless ``pss``), so pages a forked worker shares with its parent are not
    counted twice. (PSS is only read then: smaps_rollup walks page tables, costly for a
    multi-GiB process.)"""
    pids = _tree_pids(root)
    rss = [_rss(p) for p in pids]
    total_rss = sum(rss)
    if len(pids) == 1:
        return total_rss, total_rss
    return total_rss, sum(_pss(p) for p in pids) if pss else 0


# smaps_rollup walks every page table: read every 10 ms for two ~100 MiB processes it took ~15 %
# of a core, which on a 2-core box slows exactly the tool that uses both (never the 1-core loop)
PSS_EVERY = 5


@dataclass
class Run:
    wall_s: float
    peak_tree_bytes: int  # peak memory of the process tree (RSS, or PSS sum when several)
    peak_rss_sum_bytes: int  # peak of the plain RSS sum (over-counts shared pages)
    maxrss_bytes: int
    rc: int
    timed_out: bool
    stdout: str
    stderr: str
    cpu_s: float = 0.0  # user + system CPU of the process and the children it waited for (pool workers)

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_tree_bytes, self.maxrss_bytes)


def measure(argv: list[str], timeout_s: float, env: dict[str, str] | None = None, sample_memory: bool = True) -> Run:
    """Run ``argv`` once: wall time, peak tree memory (sampled, unless not ``sample_memory``),
    ru_maxrss, exit status, output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, start_new_session=True)
        peak = peak_rss = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak, peak_rss
            n = 0
            while not done.is_set():
                rss, mem = _tree_memory(proc.pid, pss=n % PSS_EVERY == 0)
                peak, peak_rss = max(peak, mem), max(peak_rss, rss)
                n += 1
                done.wait(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        if sample_memory:
            sampler.start()
        timed_out = False

        def kill() -> None:
            nonlocal timed_out
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout_s, kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        timer.cancel()
        done.set()
        if sample_memory:
            sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        try:  # stray grandchildren (a pool that outlived its parent) must not linger
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        out.seek(0)
        err.seek(0)
        return Run(
            wall_s=wall, peak_tree_bytes=peak, peak_rss_sum_bytes=peak_rss, maxrss_bytes=usage.ru_maxrss * 1024, rc=proc.returncode,
            timed_out=timed_out, stdout=out.read().decode("utf-8", "replace"),
            stderr=err.read().decode("utf-8", "replace"), cpu_s=usage.ru_utime + usage.ru_stime,
        )


# --------------------------------------------------------------------------- tools


def _fr_otel_cmd() -> list[str]:
    here = Path(sys.executable).parent / "fr-otel"
    if here.is_file():
        return [str(here)]
    found = shutil.which("fr-otel")
    return [found] if found else [sys.executable, "-m", "fr_otel.cli"]


def check_fr_otel(run: Run, manifest: dict[str, Any]) -> tuple[bool, str]:
    """The verdict must be a hang naming exactly the injected culprit."""
    if run.rc != 0:
        return False, f"exit {run.rc}: {_last_line(run.stderr)}"
    try:
        verdict = json.loads(run.stdout)
    except ValueError as exc:
        return False, f"output is not JSON ({exc})"
    culprits = [c.get("rank") for c in verdict.get("culprits", [])]
    want = [manifest["culprit"]]
    if culprits != want or verdict.get("verdict") != "hang":
        return False, f"verdict {verdict.get('verdict')!r}, culprits {culprits}, expected hang with {want}"
    c = verdict["culprits"][0]
    return True, f"hang: rank {culprits[0]} ({c.get('kind')}, {len(c.get('waiting_ranks', []))} waiting)"


def check_torch(run: Run, manifest: dict[str, Any]) -> tuple[bool, str]:
    """What PyTorch's analyzer made of it: crash, or whether it named the culprit."""
    if run.timed_out:
        return False, "timed out"
    if run.rc != 0:
        tb = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
        return False, f"crashed (exit {run.rc}): {tb[-1][:160] if tb else '?'}"
    text = run.stdout + run.stderr
    missing = re.findall(r"missing ranks: (\{[^}]*\})", text)
    culprit = manifest["culprit"]
    named = [m for m in missing if m == f"{{{culprit}}}"]
    errors = text.count("has errors")
    lines = len(text.splitlines())
    if named:
        return True, f"names missing rank {{{culprit}}}; {errors} other error report(s), {lines} lines"
    return False, f"did not name rank {culprit} alone (missing sets: {missing[:3]}); {lines} lines"


def check_unpickle(run: Run, manifest: dict[str, Any]) -> tuple[bool, str]:
    if run.rc != 0:
        return False, f"exit {run.rc}: {_last_line(run.stderr)}"
    return True, run.stdout.strip()


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


@dataclass
class Tool:
    key: str
    label: str
    argv: Callable[[Path, str], list[str]]
    check: Callable[[Run, dict[str, Any]], tuple[bool, str]]
    reps: int
    env: dict[str, str] | None = None  # None: bench_env()
    runs: list[Run] = field(default_factory=list)  # timed, no memory sampler
    results: list[tuple[bool, str]] = field(default_factory=list)
    memory_runs: list[Run] = field(default_factory=list)  # sampled for peak memory, not timed


def bench_env(**extra: str) -> dict[str, str]:
    """Every tool's environment, with bytecode caches used and written as in an installed package
    (``pip install`` compiles .pyc files). A shell with PYTHONDONTWRITEBYTECODE (this project's
    machines set it) would make fr-otel recompile ~170 modules on every start (~0.12 s), which the
    bare loops, importing only precompiled stdlib, never pay."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return env | extra


def compile_packages(*packages: Path) -> None:
    """Write each package's .pyc files next to its sources (``__pycache__``, git-ignored) before
    timing; the standard library and torch have theirs already. A failure stops the benchmark."""
    for package in packages:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], check=True,
                       capture_output=True, env=bench_env())


def _fr_otel_package() -> Path:
    probe = "import fr_otel, os; print(os.path.dirname(fr_otel.__file__))"
    return Path(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                               env=bench_env()).stdout.strip())


def make_tools(args: argparse.Namespace) -> list[Tool]:
    fr = _fr_otel_cmd()
    py = sys.executable
    cores = usable_cpus()
    tools = [
        Tool("fr-otel", f"fr-otel ({cores} cores)", lambda d, p: [*fr, "analyze", str(d), "--json"],
             check_fr_otel, args.reps),
        Tool("fr-otel-w1", "fr-otel --workers 1", lambda d, p: [*fr, "analyze", str(d), "--json", "--workers", "1"],
             check_fr_otel, args.reps),
        Tool("unpickle", "pickle.load loop", lambda d, p: [py, "-c", UNPICKLE_SNIPPET, str(d), p],
             check_unpickle, args.reps),
        Tool("unpickle-nogc", "pickle.load, gc off", lambda d, p: [py, "-c", UNPICKLE_SNIPPET, str(d), p, "nogc"],
             check_unpickle, args.reps),
        Tool("unpickle-discard", "pickle.load each, drop, gc off",
             lambda d, p: [py, "-c", UNPICKLE_SNIPPET, str(d), p, "discard"], check_unpickle, args.reps),
        Tool("torch", "torch fr_trace", lambda d, p: [py, "-m", "torch.distributed.flight_recorder.fr_trace",
                                                      str(d), "-p", p], check_torch, args.torch_reps),
    ]
    if args.baseline_src:
        env = bench_env(PYTHONPATH=str(args.baseline_src))
        tools.insert(1, Tool("fr-otel-base", "fr-otel (baseline src)",
                             lambda d, p: [py, "-m", "fr_otel.cli", "analyze", str(d), "--json"],
                             check_fr_otel, args.reps, env))
    return [t for t in tools if t.key not in args.skip]


# --------------------------------------------------------------------------- running


def src_fingerprint() -> str:
    """Size+mtime of every fr_otel source file: tells when the package changed under a run."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("fr_otel")
        root = Path(spec.origin).parent if spec and spec.origin else None
    except (ImportError, ValueError):
        root = None
    if root is None:
        return "?"
    parts = []
    for p in sorted(root.rglob("*.py")):
        st = p.stat()
        parts.append(f"{p.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")
    import hashlib

    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:12]


def _warm_cache(directory: Path) -> int:
    total = 0
    for p in directory.iterdir():
        if p.is_file():
            with open(p, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    total += len(chunk)
    return total


def _disk_bytes(directory: Path, prefix: str, ranks: int) -> int:
    return sum(os.path.getsize(directory / f"{prefix}{r}") for r in range(ranks))


def _fmt_s(runs: list[Run]) -> tuple[str, float | None]:
    ok = [r.wall_s for r in runs if not r.timed_out]
    if not ok:
        return (f">{runs[0].wall_s:.0f} (timeout)" if runs else "-"), None
    med = statistics.median(ok)
    spread = f" [{min(ok):.2f}-{max(ok):.2f}]" if len(ok) > 1 else ""
    return f"{med:.2f}{spread}", med


def bench_config(ranks: int, entries: int, args: argparse.Namespace, p2p: bool | None = None) -> dict[str, Any]:
    p2p = args.p2p if p2p is None else p2p
    out = make_scaled_dumps.default_out(ranks, entries, args.data_dir, p2p=p2p)
    t0 = time.perf_counter()
    manifest = make_scaled_dumps.generate(ranks, entries, out, prefix=args.prefix,
                                          cache_dir=args.data_dir / "recordings", p2p=p2p)
    gen_s = time.perf_counter() - t0
    disk = _disk_bytes(out, args.prefix, ranks)
    print(f"\n== {ranks} ranks x {entries} entries: {out} ({disk / MiB:.1f} MiB on disk, culprit rank "
          f"{manifest['culprit']}; ready in {gen_s:.1f} s) ==", flush=True)
    _warm_cache(out)
    tools = make_tools(args)
    compile_packages(_fr_otel_package(), *([args.baseline_src] if args.baseline_src else []))
    src_before = src_fingerprint()
    max_reps = max((t.reps for t in tools), default=0)
    for rep in range(max_reps):
        order = tools[rep % len(tools):] + tools[: rep % len(tools)]
        for tool in order:
            if len(tool.runs) >= tool.reps:
                continue
            timeout = args.torch_timeout if tool.key == "torch" else args.timeout
            run = measure(tool.argv(out, args.prefix), timeout, tool.env or bench_env(), sample_memory=False)
            ok, note = tool.check(run, manifest)
            tool.runs.append(run)
            tool.results.append((ok, note))
            flag = "ok " if ok else ("FAIL" if tool.key.startswith("fr-otel") else "note")
            print(f"  rep {rep + 1}: {tool.label:<22} {run.wall_s:8.2f} s  {run.cpu_s:7.2f} s CPU  "
                  f"[{flag}] {note}", flush=True)
            if not ok and tool.key.startswith("fr-otel"):
                print("!" * 78 + f"\n!!! FAIL: fr-otel did not name exactly the injected culprit rank "
                      f"{manifest['culprit']}: {note}\n" + "!" * 78, flush=True)
    for tool in tools:
        if tool.runs and not all(r.timed_out for r in tool.runs):
            timeout = args.torch_timeout if tool.key == "torch" else args.timeout
            run = measure(tool.argv(out, args.prefix), timeout, tool.env or bench_env(), sample_memory=True)
            tool.memory_runs.append(run)
            print(f"  memory: {tool.label:<22} {run.peak_bytes / MiB:8.0f} MiB peak (this run not timed)", flush=True)
    result = _report(ranks, entries, disk, manifest, tools)
    src_after = src_fingerprint()
    result["fr_otel_src"] = src_after
    if src_after != src_before:
        result["src_changed_during_run"] = True
        print("  WARNING: fr_otel's source changed during this configuration's runs "
              f"({src_before} -> {src_after}): its numbers mix versions; run again")
    return result


def _report(ranks: int, entries: int, disk: int, manifest: dict[str, Any], tools: list[Tool]) -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    print(f"\n  {'tool':<22} {'median s [min-max]':>22} {'peak MiB':>9} {'max 1-proc':>10} {'mem/disk':>8}  result")
    for t in tools:
        text, med = _fmt_s(t.runs)
        peak = max((r.peak_bytes for r in t.runs + t.memory_runs), default=0)
        single = max((r.maxrss_bytes for r in t.runs + t.memory_runs), default=0)
        ok = all(o for o, _ in t.results) if t.results else None
        note = t.results[-1][1] if t.results else ""
        rows[t.key] = {"label": t.label, "median_s": med, "all_s": [r.wall_s for r in t.runs],
                       "by_rep": [None if r.timed_out else r.wall_s for r in t.runs],
                       "cpu_by_rep": [None if r.timed_out else r.cpu_s for r in t.runs],
                       "peak_mib": peak / MiB, "max_single_process_mib": single / MiB,
                       "peak_rss_sum_mib": max((r.peak_rss_sum_bytes for r in t.runs + t.memory_runs), default=0) / MiB,
                       "mem_over_disk": peak / disk if disk else None, "ok": ok, "note": note,
                       "rcs": [r.rc for r in t.runs]}
        print(f"  {t.label:<22} {text:>22} {peak / MiB:9.0f} {single / MiB:10.0f} {peak / disk:8.2f}  {note[:90]}")
    print(f"  dumps on disk: {disk / MiB:.1f} MiB ({ranks} files, {disk / ranks / 1024:.0f} KiB each, "
          f"{disk / (ranks * entries):.0f} B/entry)")
    ratios = _ratios(rows)
    print("  time ratios: median over repetitions of (a / b) from the same repetition")
    for ln in _ratio_lines(ratios):
        print("  " + ln)
    return {"ranks": ranks, "entries": entries, "disk_mib": disk / MiB, "culprit": manifest["culprit"],
            "tools": rows, "ratios": ratios}


def _ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Time ratios paired by repetition (a and b ran back to back, under the same machine
    load): the median of a_i / b_i. Runs that timed out pair with nothing."""

    def ratio(a: str, b: str) -> float | None:
        ra, rb = rows.get(a, {}).get("by_rep", []), rows.get(b, {}).get("by_rep", [])
        pairs = [x / y for x, y in zip(ra, rb) if x and y]
        return statistics.median(pairs) if pairs else None

    out: dict[str, float] = {}
    wanted = {
        "fr_otel_over_unpickle": ("fr-otel", "unpickle"),
        "fr_otel_w1_over_unpickle": ("fr-otel-w1", "unpickle"),
        "fr_otel_over_unpickle_nogc": ("fr-otel", "unpickle-nogc"),
        "fr_otel_w1_over_unpickle_nogc": ("fr-otel-w1", "unpickle-nogc"),
        "fr_otel_over_unpickle_discard": ("fr-otel", "unpickle-discard"),
        "fr_otel_w1_over_unpickle_discard": ("fr-otel-w1", "unpickle-discard"),
        "torch_over_fr_otel": ("torch", "fr-otel"),
        "torch_over_fr_otel_w1": ("torch", "fr-otel-w1"),
        "speedup_all_cores": ("fr-otel-w1", "fr-otel"),
        "fr_otel_over_baseline": ("fr-otel", "fr-otel-base"),
        "baseline_over_unpickle_discard": ("fr-otel-base", "unpickle-discard"),
    }
    for name, (a, b) in wanted.items():
        v = ratio(a, b)
        if v is not None:
            out[name] = v

    def cpu_ratio(a: str, b: str) -> float | None:
        ca, cb = rows.get(a, {}).get("cpu_by_rep", []), rows.get(b, {}).get("cpu_by_rep", [])
        pairs = [x / y for x, y in zip(ca, cb) if x and y]
        return statistics.median(pairs) if pairs else None

    # work done, whatever the machine's other load: the 1.0x wall target needs < 2x here
    for name, (a, b) in {"fr_otel_cpu_over_unpickle_discard_cpu": ("fr-otel", "unpickle-discard"),
                         "baseline_cpu_over_unpickle_discard_cpu": ("fr-otel-base", "unpickle-discard"),
                         "fr_otel_over_baseline_cpu": ("fr-otel", "fr-otel-base")}.items():
        v = cpu_ratio(a, b)
        if v is not None:
            out[name] = v
    torch_row = rows.get("torch", {})
    if "torch_over_fr_otel" not in out and torch_row.get("all_s") and rows.get("fr-otel", {}).get("median_s"):
        # Every torch run timed out: its time is at least the timeout.
        out["torch_over_fr_otel_at_least"] = min(torch_row["all_s"]) / rows["fr-otel"]["median_s"]
    for key, name in (("fr-otel", "fr_otel_mem_over_disk"), ("fr-otel-w1", "fr_otel_w1_mem_over_disk"),
                      ("fr-otel-base", "baseline_mem_over_disk")):
        if rows.get(key, {}).get("mem_over_disk") is not None:
            out[name] = rows[key]["mem_over_disk"]
    return out


def _ratio_lines(q: dict[str, float]) -> list[str]:
    def line(label: str, value: float, target: str = "", ok: bool | None = None) -> str:
        tail = f"  (target {target}) {'MET' if ok else 'MISSED'}" if target else ""
        return f"{label:<50} = {value:6.2f}x{tail}"

    lines = []
    for suffix, what in (("", "pickle.load loop"), ("_nogc", "pickle.load, gc off"),
                         ("_discard", "pickle.load each, drop, gc off")):
        v = q.get(f"fr_otel_over_unpickle{suffix}")
        if v is not None:
            target = TARGET_FLOOR_RATIO if suffix == "_discard" else TARGET_UNPICKLE_RATIO
            lines.append(line(f"fr-otel / {what}", v, f"<= {target}x", v <= target))
        v = q.get(f"fr_otel_w1_over_unpickle{suffix}")
        if v is not None:
            lines.append(line(f"fr-otel -w1 / {what} (1 core each)", v))
    v = q.get("fr_otel_cpu_over_unpickle_discard_cpu")
    if v is not None:
        lines.append(line("  in CPU seconds (fr-otel's processes, all cores)", v))
    v = q.get("torch_over_fr_otel")
    if v is not None:
        lines.append(line("torch / fr-otel", v, f">= {TARGET_TORCH_RATIO}x", v >= TARGET_TORCH_RATIO))
    v = q.get("torch_over_fr_otel_at_least")
    if v is not None:
        lines.append(line("torch / fr-otel (torch timed out: at least)", v, f">= {TARGET_TORCH_RATIO}x",
                          v >= TARGET_TORCH_RATIO))
    v = q.get("torch_over_fr_otel_w1")
    if v is not None:
        lines.append(line("torch / fr-otel -w1", v))
    for key, what in (("fr_otel_mem_over_disk", "fr-otel"), ("fr_otel_w1_mem_over_disk", "fr-otel -w1")):
        v = q.get(key)
        if v is not None:
            lines.append(line(f"{what} peak memory / dumps on disk", v, f"<= ~{TARGET_MEM_DISK}x", v <= TARGET_MEM_DISK))
    for key, label in (
        ("baseline_over_unpickle_discard", "--baseline-src fr-otel / pickle.load each, drop"),
        ("baseline_cpu_over_unpickle_discard_cpu", "  in CPU seconds"),
        ("baseline_mem_over_disk", "--baseline-src fr-otel peak memory / dumps on disk"),
        ("fr_otel_over_baseline", "fr-otel / fr-otel from --baseline-src (after / before)"),
        ("fr_otel_over_baseline_cpu", "  the same in CPU seconds (robust to a loaded box)"),
    ):
        if (v := q.get(key)) is not None:
            lines.append(line(label, v))
    v = q.get("speedup_all_cores")
    if v is not None:
        lines.append(line(f"fr-otel -w1 time / all {usable_cpus()} cores time", v))
    return lines


def _parse_config(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expected RANKSxENTRIES such as 1024x2000, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=_parse_config, action="append", default=None, metavar="RANKSxENTRIES",
                    help=f"repeatable (default: {' '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--quick", action="store_true", help=f"just {' '.join(QUICK_CONFIGS)}")
    ap.add_argument("--floor", action="store_true",
                    help=f"issue 14's floor: {' and '.join(FLOOR_CONFIGS)} (unless --config), only "
                    f"{' and '.join(FLOOR_TOOLS)}: wall ratio, CPU ratio and peak memory / disk")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of fr-otel / unpickle (default: %(default)s)")
    ap.add_argument("--torch-reps", type=int, default=None,
                    help="repetitions of PyTorch's analyzer (default: --reps for --quick, else 1)")
    ap.add_argument("--skip", action="append", default=[], choices=TOOL_KEYS)
    ap.add_argument("--p2p", action="store_true", help="dumps with pipeline send/recv (see make_scaled_dumps.py)")
    ap.add_argument("--shapes", action="store_true",
                    help=f"gloo- and Megatron-shaped (--p2p) {SHAPES_CONFIG[0]}x{SHAPES_CONFIG[1]} side by side, only "
                    f"{' and '.join(FLOOR_TOOLS)} (issue 27's pair of floors)")
    ap.add_argument("--baseline-src", type=Path, default=None, metavar="DIR",
                    help="also time `analyze` with PYTHONPATH=DIR (another checkout's src): before/after")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run (default: %(default)s)")
    ap.add_argument("--torch-timeout", type=float, default=900, help="seconds per torch run (default: %(default)s)")
    ap.add_argument("--prefix", default="rank_")
    ap.add_argument("--data-dir", type=Path, default=make_scaled_dumps.DEFAULT_ROOT)
    ap.add_argument("--json-out", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    presets = FLOOR_CONFIGS if args.floor else QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS
    configs = args.config or [_parse_config(c) for c in presets]
    if args.shapes:
        return _both_shapes(args)
    if args.floor:
        keep = {*FLOOR_TOOLS, *(("fr-otel-base",) if args.baseline_src else ())}
        args.skip = sorted({*args.skip, *(k for k in TOOL_KEYS if k not in keep)})
    if args.torch_reps is None:
        args.torch_reps = args.reps if args.quick else 1
    print(f"fr-otel analysis benchmark: {usable_cpus()} usable cores, python {sys.version.split()[0]}, "
          f"fr-otel = {' '.join(_fr_otel_cmd())}")
    results = [bench_config(r, e, args) for r, e in configs]
    _summary(results)
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    failed = [r for r in results for k in ("fr-otel", "fr-otel-base", "fr-otel-w1")
              if r["tools"].get(k, {}).get("ok") is False]
    if failed:
        print("\nFAIL: fr-otel did not name the injected culprit in at least one run (see above)")
    return 1 if failed else 0


def _load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def _both_shapes(args: argparse.Namespace) -> int:
    """Both dump shapes at one size, one after the other in this run (each tool pair interleaved
    per repetition, ratios paired), and their ratios to the one-core loop side by side."""
    keep = {*FLOOR_TOOLS, *(("fr-otel-base",) if args.baseline_src else ())}
    args.skip = sorted({*args.skip, *(k for k in TOOL_KEYS if k not in keep)})
    ranks, entries = SHAPES_CONFIG
    print(f"fr-otel analysis benchmark, both shapes: {usable_cpus()} usable cores, python {sys.version.split()[0]}, "
          f"load average {_load()} at the start")
    results = [(name, bench_config(ranks, entries, args, p2p=p2p)) for name, p2p in SHAPES]
    print(f"\n== both shapes, {ranks} x {entries}: fr-otel / the unpickle-and-drop loop (1 core), median of "
          f"{args.reps} paired runs; load average {_load()} at the end ==")
    for name, r in results:
        q = r["ratios"]
        wall, cpu = q.get("fr_otel_over_unpickle_discard"), q.get("fr_otel_cpu_over_unpickle_discard_cpu")
        fr, floor = r["tools"]["fr-otel"]["median_s"], r["tools"]["unpickle-discard"]["median_s"]
        verdict = "MET" if wall is not None and wall <= TARGET_FLOOR_RATIO else "MISSED"
        print(f"  {name:<16} {wall or float('nan'):5.2f}x  (fr-otel {fr or float('nan'):.2f} s, loop "
              f"{floor or float('nan'):.2f} s; CPU {cpu or float('nan'):.2f}x)  target <= {TARGET_FLOOR_RATIO}x {verdict}")
    if args.json_out:
        args.json_out.write_text(json.dumps([{"shape": n, **r} for n, r in results], indent=1))
    failed = [r for _, r in results if r["tools"].get("fr-otel", {}).get("ok") is False]
    return 1 if failed else 0


def _cell(q: dict[str, float], key: str) -> str:
    if q.get(key) is not None:
        return f"{q[key]:12.2f}"
    if q.get(f"{key}_at_least") is not None:
        return f"{'>' + format(q[key + '_at_least'], '.1f'):>12}"
    return f"{'-':>12}"


def _summary(results: list[dict[str, Any]]) -> None:
    keys = ("fr-otel", "fr-otel-w1", "unpickle", "unpickle-nogc", "unpickle-discard", "torch")
    print("\n== summary: median wall s / peak MiB ==")
    print(f"{'config':>11} {'disk MiB':>8} | " + " | ".join(f"{k:>14}" for k in keys))
    for r in results:
        cells = []
        for key in keys:
            row = r["tools"].get(key)
            if not row:
                cells.append(f"{'-':>14}")
            elif row["median_s"] is None:
                cells.append(f"{'timeout':>14}")
            else:
                cells.append(f"{row['median_s']:7.2f}/{row['peak_mib']:6.0f}")
        print(f"{r['ranks']:>5}x{r['entries']:<5} {r['disk_mib']:8.1f} | " + " | ".join(cells))
    cols = (("fr_otel_over_unpickle", "fr/unpk"), ("fr_otel_over_unpickle_nogc", "fr/unpk-nogc"),
            ("fr_otel_over_unpickle_discard", "fr/floor"), ("fr_otel_cpu_over_unpickle_discard_cpu", "CPU fr/floor"),
            ("fr_otel_w1_over_unpickle_nogc", "w1/unpk-nogc"), ("torch_over_fr_otel", "torch/fr"),
            ("torch_over_fr_otel_w1", "torch/w1"), ("fr_otel_mem_over_disk", "mem/disk"),
            ("fr_otel_w1_mem_over_disk", "w1 mem/disk"), ("speedup_all_cores", "w1/fr"))
    print("\n== summary: ratios (time ratios paired by repetition) ==")
    print(f"{'config':>11} | " + " ".join(f"{h:>12}" for _, h in cols))
    for r in results:
        q = r["ratios"]
        print(f"{r['ranks']:>5}x{r['entries']:<5} | " + " ".join(
            _cell(q, k) for k, _ in cols))
    print(f"targets: fr/unpk <= {TARGET_UNPICKLE_RATIO}, fr/unpk-discard <= {TARGET_FLOOR_RATIO}, "
          f"torch/fr >= {TARGET_TORCH_RATIO}, "
          f"mem/disk <= ~{TARGET_MEM_DISK}")


if __name__ == "__main__":
    sys.exit(main())
