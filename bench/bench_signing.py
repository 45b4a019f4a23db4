#!/usr/bin/env python3
"""Benchmark the job's signed store records (``FR_OTEL_JOB_SECRET``): what signing costs a record, a poll, a step.

**Per record.** :class:`fr_otel.agent.links.signing.Seal` signing and verifying the records the agents exchange,
at their real sizes (a heartbeat, a rank's waits, a host record, a recorder payload, an incident's files): median
microseconds per sign and per verify.

**Per poll.** One rank's store work on a poll (its heartbeat, its waits, the heartbeats of 8 peers read back),
through the agent's own :class:`~fr_otel.agent.links.channel.IncidentChannel` on a real TCPStore on loopback,
signed and unsigned in alternating rounds: median and p99 microseconds per poll of each.

**Per training step.** A small MLP trains on the main thread (forward, backward, SGD step) while a thread does
one poll's store work every ``--poll-ms`` (10 ms: a hundred times the agent's 1 s, to make any cost visible), in
alternating phases: no poller, unsigned poller, signed poller. Mean step time per condition and the signed phase
pairs' overhead over the unsigned (median and spread over pairs).

    python bench/bench_signing.py            # all three (~1 min)
    python bench/bench_signing.py --quick

Benchmarks print numbers; they are not tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from datetime import timedelta
from typing import Any

from fr_otel.agent.links.channel import IncidentChannel
from fr_otel.agent.links.signing import Seal, new_secret
from fr_otel.common.ports import unused_tcp_port

SEAL = Seal(new_secret().encode(), "bench")
SIZES = {"heartbeat": 30, "waits": 1200, "host record": 160, "recorder payload": 20_000, "incident files": 200_000}


def per_record(reps: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, size in SIZES.items():
        value = bytes(range(256)) * (size // 256 + 1)
        value = value[:size]
        signs, opens = [], []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            blob = SEAL.sign("i/1/dump/3", value)
            t1 = time.perf_counter_ns()
            assert SEAL.open("i/1/dump/3", blob) == value
            t2 = time.perf_counter_ns()
            signs.append(t1 - t0)
            opens.append(t2 - t1)
        out[name] = {"bytes": size, "sign_us": statistics.median(signs) / 1e3, "verify_us": statistics.median(opens) / 1e3}
    return out


def _channels(port: int) -> tuple[Any, IncidentChannel, IncidentChannel]:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))

    def client(prefix: str, seal: Seal | None) -> IncidentChannel:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=30))
        return IncidentChannel(dist.PrefixStore(prefix, store), "bench", seal=seal)
    return server, client("plain/", None), client("signed/", SEAL)


_WAITS = {"0": {"n": 12, "sum_ms": 340.5, "max_ms": 61.2, "peers": [1, 2, 3, 4, 5, 6, 7]}}


def _poll(channel: IncidentChannel, i: int) -> None:
    channel.heartbeat(0, time.time_ns(), i)
    channel.publish_waits(0, _WAITS)
    channel.last_heard(list(range(8)))


def per_poll(channels: tuple[IncidentChannel, IncidentChannel], rounds: int, polls: int) -> dict[str, dict[str, float]]:
    plain, signed = channels
    for r in range(8):  # every peer has beaten once
        plain.heartbeat(r, time.time_ns(), 0)
        signed.heartbeat(r, time.time_ns(), 0)
    times: dict[str, list[int]] = {"unsigned": [], "signed": []}
    for n in range(rounds):
        order = [("unsigned", plain), ("signed", signed)]
        for name, channel in order if n % 2 == 0 else order[::-1]:
            for i in range(polls):
                t0 = time.perf_counter_ns()
                _poll(channel, i)
                times[name].append(time.perf_counter_ns() - t0)
    return {name: {"median_us": statistics.median(ts) / 1e3, "p99_us": sorted(ts)[int(0.99 * len(ts))] / 1e3}
            for name, ts in times.items()}


def per_step(channels: tuple[IncidentChannel, IncidentChannel], phases: int, steps: int,
             poll_s: float) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    for _ in range(50):
        step()
    plain, signed = channels
    means: dict[str, list[float]] = {"off": [], "unsigned": [], "signed": []}
    for n in range(phases):
        order = [("off", None), ("unsigned", plain), ("signed", signed)]
        for name, channel in order if n % 2 == 0 else order[::-1]:
            stop = threading.Event()

            def poller(ch: IncidentChannel = channel) -> None:  # type: ignore[assignment]
                i = 0
                while not stop.wait(poll_s):
                    _poll(ch, i)
                    i += 1
            thread = threading.Thread(target=poller, daemon=True) if channel is not None else None
            if thread is not None:
                thread.start()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            means[name].append((time.perf_counter() - t0) / steps)
            stop.set()
            if thread is not None:
                thread.join()
    pairs = [s / u - 1 for s, u in zip(means["signed"], means["unsigned"])]
    return {"step_ms": {k: statistics.mean(v) * 1e3 for k, v in means.items()},
            "signed_over_unsigned": {"median": statistics.median(pairs), "min": min(pairs), "max": max(pairs)},
            "unsigned_over_off_median": statistics.median(u / o - 1 for u, o in zip(means["unsigned"], means["off"]))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--part", choices=("record", "poll", "step", "all"), default="all")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--phases", type=int, default=10, help="alternating phase triples for the step part")
    ap.add_argument("--steps", type=int, default=300, help="training steps per phase")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="the poller's interval in the step part")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if args.quick:
        args.phases, args.steps = 4, 150
    results: dict[str, Any] = {}
    if args.part in ("record", "all"):
        results["record"] = per_record(200 if args.quick else 2000)
        for name, r in results["record"].items():
            print(f"{name:17} {r['bytes']:>7} B: sign {r['sign_us']:7.1f} us, verify {r['verify_us']:7.1f} us")
    if args.part in ("poll", "step", "all"):
        server, plain, signed = _channels(unused_tcp_port())
        if args.part in ("poll", "all"):
            results["poll"] = per_poll((plain, signed), 4 if args.quick else 10, 100)
            for name, r in results["poll"].items():
                print(f"one poll's store work, {name:8}: median {r['median_us']:7.1f} us, p99 {r['p99_us']:7.1f} us")
        if args.part in ("step", "all"):
            results["step"] = s = per_step((plain, signed), args.phases, args.steps, args.poll_ms / 1e3)
            print("step time (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in s["step_ms"].items())
                  + f"; poller every {args.poll_ms:g} ms")
            o = s["signed_over_unsigned"]
            print(f"signed over unsigned, per phase pair: median {o['median']:+.2%} (min {o['min']:+.2%}, "
                  f"max {o['max']:+.2%}); unsigned over off: median {s['unsigned_over_off_median']:+.2%}")
        del server
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
