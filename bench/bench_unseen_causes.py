"""Which cause class fr-otel names for everyday training code its rules were not written from.

Each job is a small 2-rank gloo loop under torchrun with the agent, whose rank 1 stops in code written the way
people write training scripts (a tqdm progress bar over a prefetch queue, a ``multiprocessing.Pool`` for
preprocessing, a model's forward, a thread pool of uploads), not the way ``tests/support/cause_job.py`` injects
a fault. The script prints, per job, the class the incident named for rank 1, the class a person reading the
code would name, and the evidence's first line; it sets no gate (the tests do). Generated data goes under
``/tmp/fr-otel-bench/unseen-causes/``.

    .venv/bin/python bench/bench_unseen_causes.py            # the four jobs, ~20-40 s each
    .venv/bin/python bench/bench_unseen_causes.py --job pool_map
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from fr_otel.scenarios.job import gloo_on_loopback

#: job -> the class a person reading the code would name.
EXPECTED = {
    "tqdm_prefetch": "thread_wait",  # the prefetch thread is stuck in a slow "download"; the loop waits on its queue
    "pool_map": "child_wait",  # a worker of the preprocessing pool never returns
    "model_forward": "native_busy",  # a forward far bigger than meant: torch computes, the GIL released
    "upload_future": "thread_wait",  # a checkpoint upload in a thread pool; .result() waits on it
}

JOB = r'''
import os, queue, sys, threading, time
from datetime import timedelta
import torch, torch.distributed as dist
import fr_otel

torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
dist.barrier()
fr_otel.start()
rank, kind = dist.get_rank(), os.environ["UNSEEN_JOB"]


def slow_download(i):
    time.sleep(3600 if i >= 5 else 0.01)  # the object store stopped answering
    return torch.ones(8)


def preprocess(x):
    if x == 3:
        time.sleep(3600)  # one sample's decoder hangs
    return x * 2


def train(steps):
    w = torch.ones(1024)
    if kind == "tqdm_prefetch" and rank == 1:
        from tqdm import tqdm
        prefetched = queue.Queue(maxsize=2)

        def prefetch():
            for i in range(steps):
                prefetched.put(slow_download(i))
        threading.Thread(target=prefetch, daemon=True, name="prefetch").start()
        batches = (prefetched.get() for _ in range(steps))
    else:
        from tqdm import tqdm
        batches = (torch.ones(8) for _ in range(steps))
    for step, batch in enumerate(tqdm(batches, total=steps, disable=rank != 0)):
        time.sleep(0.05)
        if step == 6 and rank == 1 and kind == "pool_map":
            import multiprocessing
            with multiprocessing.Pool(2) as pool:
                pool.map(preprocess, range(8))
        if step == 6 and rank == 1 and kind == "model_forward":
            model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096))
            with torch.no_grad():
                for _ in range(10_000):
                    out = model(torch.ones(2048, 4096))
        if step == 6 and rank == 1 and kind == "upload_future":
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(max_workers=1) as uploads:
                done = uploads.submit(lambda: time.sleep(3600))
                done.result()
        dist.all_reduce(w)


train(12)
'''


def run(job: str, root: Path) -> dict[str, object]:
    folder = root / job
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_"))}
    env.update(UNSEEN_JOB=job, OMP_NUM_THREADS="1", FR_OTEL_STALL_SECONDS="3", FR_OTEL_METRICS_PORT="off",
               FR_OTEL_OUT_DIR=str(folder / "out"), FR_OTEL_NODE_DIR=str(folder / "node"))
    gloo_on_loopback(env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
    log = open(folder / "job.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    began = time.monotonic()
    found: list[Path] = []
    try:
        while time.monotonic() - began < 120 and not found and proc.poll() is None:
            time.sleep(0.5)
            found = list((folder / "out").glob("dumps/*/incident.json"))
        time.sleep(2)  # the summary is written once the incident concludes
        found = list((folder / "out").glob("dumps/*/incident.json"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    if not found:
        return {"job": job, "expected": EXPECTED[job], "named": "(no incident)", "evidence": ""}
    summary = json.loads(found[0].read_text())["summary"]
    mine = next((c for c in summary["culprits"] if c["rank"] == 1), None)
    cause = mine["cause"] if mine else {"class": "(rank 1 not named)", "evidence": []}
    return {"job": job, "expected": EXPECTED[job], "named": cause["class"], "verdict": summary["verdict"],
            "evidence": (cause["evidence"] or [""])[:3], "seconds": round(time.monotonic() - began, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", action="append", choices=sorted(EXPECTED), help="one job (repeatable); default all")
    parser.add_argument("--out", default="/tmp/fr-otel-bench/unseen-causes", metavar="DIR")
    args = parser.parse_args()
    results = [run(job, Path(args.out)) for job in (args.job or list(EXPECTED))]
    for r in results:
        mark = "ok  " if r["named"] == r["expected"] else "MISS"
        print(f"{mark} {r['job']:<14} named {r['named']:<14} expected {r['expected']:<12} {r.get('evidence')}")
    hits = sum(r["named"] == r["expected"] for r in results)
    print(f"{hits} of {len(results)} named as a reader of the code would")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
