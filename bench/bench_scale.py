#!/usr/bin/env python3
"""The live incident path at 1k/4k/16k simulated ranks, against a real TCPStore.

What is real: the store (``torch.distributed.TCPStore`` server in its own process), the
agent's incident protocol (:class:`fr_otel.agent.channel.IncidentChannel` over the same
``PrefixStore`` chain :func:`connect_channel` builds), the payloads
(:func:`fr_otel.agent.payload.encode_payload` on realistic recorders), the coordinator
(:func:`fr_otel.agent.store_gather.gather` and :func:`fr_otel.agent.incident_work.conclude` in a process of its own, on a real
``IncidentRank``), and the trace's destination (a loopback OTLP/gRPC receiver from :mod:`fr_otel.testing.otlp`).

What is simulated: the ranks. ``--procs`` poller processes play N ranks over ``--conns``
store connections each (a TCPStore client takes ~0.1 s to open here, so 16k real
connections are out of reach; every poll is still one real ``check`` round trip, and a
connection plays N/connections ranks at N/connections times the rate). Each simulated
rank polls the incident key once per ``poll_interval`` (as the agent does), notices the
incident on its next poll and publishes its payload (``set`` + ``add``) right then.

Recorders: 2000 entries per rank, a Megatron-like layout (TP 8, PP 4 below 16k ranks and
8 at 16k, DP the rest; rank = pp*(DP*TP) + dp*TP + tp), one iteration = 3 TP all_reduce,
PP send+recv (p2p, NCCL shape), DP reduce_scatter + all_gather, a world all_reduce. Rank
N//3 never enqueued the last world all_reduce; every other rank has it in flight. Each
rank's payload is built from the newest entries only (the trim keeps 64 per group, the
same result as trimming all 2000: checked on a sample rank), so setting up 16k ranks
takes seconds, not minutes; the 2000-entry encode cost is timed on that sample rank.

A probe process plays the training's own store calls (``set`` then ``get`` of a small key
every 10 ms on its own connection) and records their latency: baseline (no agents),
polling, and during the incident (raise -> trace delivered).

    python bench/bench_scale.py                        # 1024, 4096, 16384 ranks
    python bench/bench_scale.py --ranks 1024 --poll-scale 1 --poll-scale 4 --poll-scale 16
    python bench/bench_scale.py --ranks 4096 --conns 32

Goals at 16k: trace within 60 s of the raise, coordinator peak memory < 2 GiB, store p99
for other clients < 50 ms during the incident. Benchmarks print numbers; they are not tests.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

TP = 8
ENTRIES = 2000
KEEP = 64  # FR_OTEL_INCIDENT_ENTRIES default
PROBE_EVERY_S = 0.010
GOAL_TRACE_S = 60.0
GOAL_MEM = 2 * 2**30
GOAL_P99_S = 0.050
JOB_ID = "bench-scale"
# One iteration, in record order: (group kind, op, p2p)
ITERATION = (("tp", "all_reduce", False), ("pp", "send", True), ("tp", "all_reduce", False), ("pp", "recv", True),
             ("dp", "reduce_scatter", False), ("dp", "all_gather", False), ("tp", "all_reduce", False),
             ("world", "all_reduce", False))


# --------------------------------------------------------------------------- layout and recorders

@dataclass(frozen=True)
class Layout:
    world: int
    tp: int
    pp: int

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def groups(self, rank: int) -> dict[str, tuple[str, str, tuple[int, ...], int]]:
        """kind -> (group name, desc, member ranks, local slot), names in creation order as torch gives them."""
        tp_i, dp_i, pp_i = rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)
        n_tp, n_dp = self.world // self.tp, self.world // self.dp
        tp_idx = pp_i * self.dp + dp_i
        dp_idx = pp_i * self.tp + tp_i
        pp_idx = dp_i * self.tp + tp_i
        stride = self.tp * self.dp
        return {
            "world": ("0", "default_pg", tuple(range(self.world)), 0),
            "tp": (str(1 + tp_idx), "TENSOR_MODEL_PARALLEL_GROUP", tuple(range(tp_idx * self.tp, tp_idx * self.tp + self.tp)), 1),
            "dp": (str(1 + n_tp + dp_idx), "DATA_PARALLEL_GROUP", tuple(pp_i * stride + d * self.tp + tp_i for d in range(self.dp)), 2),
            "pp": (str(1 + n_tp + n_dp + pp_idx), "PIPELINE_MODEL_PARALLEL_GROUP", tuple(dp_i * self.tp + tp_i + p * stride for p in range(self.pp)), 3),
        }


def layout_for(world: int) -> Layout:
    return Layout(world, TP, 8 if world >= 16384 else 4)


_ORDINAL = [sum(1 for k, _, _ in ITERATION[:j] if k == ITERATION[j][0]) for j in range(len(ITERATION))]
_SITES = {kind: [{"name": kind + "_step", "filename": "/workspace/megatron/core/pipeline.py", "line": 100 + i},
                 {"name": "train_step", "filename": "/workspace/megatron/training.py", "line": 700},
                 {"name": "<module>", "filename": "/workspace/pretrain_gpt.py", "line": 42}]
          for i, kind in enumerate(("tp", "pp", "dp", "world"))}
_SIZES = {"tp": [[4096, 1024]], "pp": [[1, 4096, 1024]], "dp": [[16777216]], "world": [[1]]}


def recorder(layout: Layout, rank: int, culprit: int, n_entries: int, t_end_ns: int) -> dict[str, Any]:
    """The newest ``n_entries`` of this rank's recorder, in torch's dump shape (NCCL)."""
    groups = layout.groups(rank)
    total_iters = 10_000  # the job ran a while: sequence numbers do not start at 1
    n_iter = -(-n_entries // len(ITERATION)) + 1
    stream = [(it, j) for it in range(total_iters - n_iter, total_iters) for j in range(len(ITERATION))]
    if rank == culprit:
        stream = stream[:-1]  # never enqueued the last world all_reduce
    stream = stream[-n_entries:]
    last = len(stream) - 1
    per_iter = len(ITERATION)
    count = {"tp": 3, "pp": 2, "dp": 2, "world": 1}
    entries = []
    t0 = t_end_ns - 600 * 10**9  # the hang began 10 minutes before the dump
    skew = (rank * 7919) % 300_000
    for i, (it, j) in enumerate(stream):
        kind, op, p2p = ITERATION[j]
        name, desc, _, slot = groups[kind]
        seq = it * count[kind] + _ORDINAL[j] + 1
        created = t0 - (last - i) * 2_000_000 + skew
        in_flight = i == last and rank != culprit
        sizes = _SIZES[kind]
        entries.append({
            "frames": _SITES[kind], "record_id": it * per_iter + j, "pg_id": slot,
            "process_group": (name, desc), "thread_name": "python", "thread_id": str(140000000000000 + rank),
            "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": it * per_iter + j,
            "profiling_name": f"nccl:{op}", "time_created_ns": created,
            "input_sizes": sizes, "input_dtypes": ["BFloat16"], "output_sizes": sizes, "output_dtypes": ["BFloat16"],
            "state": "scheduled" if in_flight else "completed",
            "time_discovered_started_ns": None if in_flight else created + 10_000,
            "time_discovered_completed_ns": None if in_flight else created + 900_000,
            "retired": not in_flight, "timeout_ms": 600_000, "is_p2p": p2p, "duration_ms": None if in_flight else 0.89,
        })
    status: dict[str, dict[str, int]] = {}
    for e in entries:
        if e["is_p2p"]:
            continue
        st = status.setdefault(str(e["pg_id"]), {"last_enqueued_collective": -1, "last_started_collective": -1,
                                                  "last_completed_collective": -1})
        st["last_enqueued_collective"] = e["collective_seq_id"]
        if e["state"] == "completed":
            st["last_started_collective"] = st["last_completed_collective"] = e["collective_seq_id"]
    return {"version": "2.10", "pg_config": {}, "pg_status": status, "comm_lib_version": "2.21.5",
            "entries": entries}


def payload_for(layout: Layout, rank: int, culprit: int, n_entries: int, t_end_ns: int) -> bytes:
    raw = pickle.dumps(recorder(layout, rank, culprit, n_entries, t_end_ns), protocol=2)
    return encode(layout, rank, raw, t_end_ns)


def encode(layout: Layout, rank: int, raw: bytes, t_end_ns: int) -> bytes:
    """What the rank's agent does with its recorder's bytes at an incident."""
    from fr_otel.agent.payload import encode_payload, entries_per_group
    from fr_otel.agent.recorder import GroupInfo
    from fr_otel.read.rank_process import RankProcess

    groups = [GroupInfo(name=n, desc=d, ranks=r, local_id=s) for n, d, r, s in layout.groups(rank).values()]
    process = RankProcess(host=f"node{rank // 8:05d}", pid=10_000 + rank % 8, local_rank=rank % 8, source="agent")
    return encode_payload(raw, groups, entries_per_group(KEEP, layout.world), t_end_ns, process)


# --------------------------------------------------------------------------- the store and the channel

def _store(port: int, timeout_s: float = 60.0) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def channel(port: int) -> Any:
    """The agent's channel, built as connect_channel builds it over its own connection."""
    import hashlib

    import torch.distributed as dist

    from fr_otel.agent.channel import IncidentChannel

    root = dist.PrefixStore("fr_otel/", _store(port))
    digest = hashlib.blake2b(JOB_ID.encode(), digest_size=8).hexdigest()
    return IncidentChannel(dist.PrefixStore(f"{digest}/", root), "bench")


def server(port: int, ready: Any) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    ready.set()
    while True:
        time.sleep(3600)
        store.check(["x"])


# --------------------------------------------------------------------------- roles

_BULK_ENTRIES = 9 * len(ITERATION) * KEEP // 8 + 16  # enough newest entries for the trim to keep 64 per group


class Clock:
    """Shared times (0 = not yet): polling starts, the incident is raised, everyone stops."""

    def __init__(self, ctx: Any) -> None:
        self.start, self.raise_at, self.stop = ctx.Value("d", 0.0), ctx.Value("d", 0.0), ctx.Value("d", 0.0)


def _wait_start(clock: Clock) -> float:
    while not clock.start.value or time.time() < clock.start.value:
        time.sleep(0.005)
    return clock.start.value


def poller(idx: int, ranks: list[int], world: int, conns: int, rate: float, port: int, culprit: int, t_end: int,
           clock: Any, out: Any) -> None:
    """Play ``ranks``: payloads first, then polls at ``rate`` ops/s in all, publishing on the first sighting."""
    layout = layout_for(world)
    t = time.perf_counter()
    payloads = {r: payload_for(layout, r, culprit, _BULK_ENTRIES, t_end) for r in ranks}
    gen_s = time.perf_counter() - t
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as ex:
        chans = list(ex.map(lambda _: channel(port), range(conns)))
    published: dict[int, float] = {}
    polls = 0
    poll_log: list[tuple[float, int]] = []
    out.put({"role": "ready"})
    start_at = _wait_start(clock)
    interval = len(ranks) / rate  # seconds between two polls of the same simulated rank
    began = time.time()
    i = 0
    seen_incident = False
    last_log = 0.0
    while True:
        now = time.time()
        if clock.stop.value and now >= clock.stop.value:
            break
        due = began + i / rate
        if due > now:
            time.sleep(due - now)
        rank = ranks[i % len(ranks)]
        ch = chans[i % conns]
        meta = ch.owner(2 if seen_incident else 1)
        polls += 1
        if now - last_log >= 0.2:
            poll_log.append((now, polls))
            last_log = now
        if meta is not None and not seen_incident:
            seen_incident = True
        if seen_incident and rank not in published and rank != 0:
            ch.publish(1, rank, payloads[rank])
            published[rank] = time.time()
        i += 1
    sizes = [len(p) for p in payloads.values()]
    out.put({"role": "poller", "idx": idx, "gen_s": gen_s, "ranks": len(ranks), "polls": polls, "interval": interval,
             "poll_log": poll_log, "published": list(published.values()), "sizes": sizes})


def probe(port: int, clock: Any, out: Any) -> None:
    """The training's own store calls: set + get of a small key every 10 ms, each timed."""
    store = _store(port)
    log: list[tuple[float, float]] = []
    out.put({"role": "ready"})
    while not clock.stop.value or time.time() < clock.stop.value:
        t = time.perf_counter()
        store.set("train/probe", b"x" * 64)
        store.get("train/probe")
        dt = time.perf_counter() - t
        log.append((time.time(), dt / 2))
        time.sleep(max(PROBE_EVERY_S - dt, 0))
    out.put({"role": "probe", "log": log})


def coordinator(port: int, world: int, culprit: int, t_end: int, clock: Any, endpoint: str, out_dir: str,
                out: Any) -> None:
    """Rank 0: raises incident 1 at ``raise_at`` and runs the real coordinator on a real IncidentRank."""
    from fr_otel.agent.config import AgentConfig
    from fr_otel.agent.health import HealthTracker
    from fr_otel.agent.host_map import HostMapKeeper
    from fr_otel.agent.incident_rank import IncidentRank
    from fr_otel.agent.incident_work import conclude
    from fr_otel.agent.store_gather import gather
    from fr_otel.agent.process_identity import this_process
    from fr_otel.otlp.config import resolve_export_config
    from fr_otel.common.ids import trace_id_for

    layout = layout_for(world)
    raw_full = pickle.dumps(recorder(layout, 0, culprit, ENTRIES, t_end), protocol=2)
    t = time.perf_counter()
    own = encode(layout, 0, raw_full, t_end)
    encode_full_s = time.perf_counter() - t
    # The pollers build payloads from the newest entries only: the same bytes as from all 2000.
    same = own == payload_for(layout, 0, culprit, _BULK_ENTRIES, t_end)
    link = channel(port)
    me = this_process(None)
    agent = IncidentRank(AgentConfig(out_dir=out_dir, dump_dir=out_dir, metrics_port=None),
                         resolve_export_config(endpoint=endpoint, environ={}, timeout_s=30), HealthTracker(),
                         link, JOB_ID, 0, world, me, lambda: raw_full, tuple,
                         HostMapKeeper(link, 0, world, me, leader=False, folders=list))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out.put({"role": "ready"})
    _wait_start(clock)
    while time.time() < clock.raise_at.value:
        time.sleep(0.002)
    t_raise = time.time()
    meta = {"rank": 0, "reason": "stall", "time_ns": time.time_ns(), "pg_name": "0", "seq": 0, "op": "all_reduce"}
    won, _ = agent.channel.claim(1, meta)
    agent.channel.publish(1, 0, own)
    trace_hex = f"{trace_id_for(JOB_ID, '1'):032x}"
    phases = _time_phases(agent)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    phases["_start"] = time.perf_counter()
    deadline = time.monotonic() + 300
    agent.channel.set_result(1, conclude(agent, 1, meta, gather(agent, 1, deadline), trace_hex, deadline))
    t_done = time.time()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    phases["cpu"] = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    phases["gather wait"] = phases.pop("_fetch_at", phases["_start"]) - phases.pop("_start")
    result = agent.channel.result(1) or {}
    out.put({"role": "coordinator", "won": won, "t_raise": t_raise, "t_done": t_done, "result": result,
             "rss_before": rss_before, "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
             "raw_full_bytes": len(raw_full), "encode_full_s": encode_full_s, "own_payload": len(own),
             "bulk_same": same, "phases": phases})


def _time_phases(agent: Any) -> dict[str, float]:
    """Wrap what the coordinator calls so each phase's seconds are recorded (the code itself is unchanged)."""
    import fr_otel.incident.pipeline
    import fr_otel.incident.sinks
    import fr_otel.trace.spans
    from fr_otel.agent import store_gather

    phases: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    fetch = timed("fetch payloads", agent.channel.fetch)

    def first_fetch(*a: Any, **k: Any) -> Any:
        phases.setdefault("_fetch_at", time.perf_counter())
        return fetch(*a, **k)

    agent.channel.fetch = first_fetch
    store_gather.decode_payload = timed("decode payloads", store_gather.decode_payload)
    fr_otel.incident.pipeline.build_job = timed("build job", fr_otel.incident.pipeline.build_job)
    fr_otel.incident.pipeline.analyze = timed("analyze", fr_otel.incident.pipeline.analyze)
    fr_otel.trace.spans.build_trace = timed("build trace", fr_otel.trace.spans.build_trace)
    sink = fr_otel.incident.sinks.OtlpSink
    sink.deliver = timed("export", sink.deliver)  # type: ignore[method-assign]
    return phases


# --------------------------------------------------------------------------- one configuration

def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def run(world: int, args: argparse.Namespace, poll_scale: float = 1.0, incident: bool = True) -> dict[str, Any]:
    from fr_otel.testing.otlp import OtlpGrpcReceiver
    from fr_otel.common.ports import unused_tcp_port

    ctx = mp.get_context("spawn")
    port = unused_tcp_port()
    ready = ctx.Event()
    srv = ctx.Process(target=server, args=(port, ready), daemon=True)
    srv.start()
    ready.wait(30)
    out: Any = ctx.Queue()
    culprit = world // 3
    t_end = time.time_ns()
    rate = world * poll_scale / args.poll_interval
    clock = Clock(ctx)
    tmp = tempfile.mkdtemp(prefix="fr-otel-scale-")
    procs = []
    with OtlpGrpcReceiver() as rx:
        ranks = list(range(1, world))
        for i in range(args.procs):
            mine = ranks[i::args.procs]
            procs.append(ctx.Process(target=poller, args=(i, mine, world, args.conns, rate / args.procs, port, culprit,
                                                          t_end, clock, out)))
        procs.append(ctx.Process(target=probe, args=(port, clock, out)))
        if incident:
            procs.append(ctx.Process(target=coordinator, args=(port, world, culprit, t_end, clock, rx.url, tmp, out)))
        for p in procs:
            p.start()
        for _ in procs:
            assert out.get(timeout=900)["role"] == "ready"
        baseline_from = time.time()
        start_at = baseline_from + 2.5  # a quiet baseline for the probe first
        raise_at = start_at + args.steady
        clock.raise_at.value = raise_at
        clock.start.value = start_at
        if not incident:
            clock.stop.value = raise_at
        t_trace = None
        coord_done = None
        results = []
        hard_stop = raise_at + 300
        while time.time() < hard_stop and len(results) < len(procs):
            if incident and t_trace is None and rx.span_count() > 0:
                t_trace = time.time()
                clock.stop.value = time.time() + 1.0
            try:
                results.append(out.get(timeout=0.02))
            except Exception:  # noqa: BLE001 - queue.Empty
                pass
            if any(r["role"] == "coordinator" for r in results) and not clock.stop.value:
                clock.stop.value = time.time() + 1.0
        spans = rx.span_count()
    for p in procs:
        p.join(10)
    srv.kill()
    by_role: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_role.setdefault(r["role"], []).append(r)
    pollers = by_role["poller"]
    probe_log = by_role["probe"][0]["log"]
    coord = by_role.get("coordinator", [{}])[0]
    t_raise = coord.get("t_raise", raise_at)
    t_stop = t_trace or coord.get("t_done") or clock.stop.value
    baseline_end = start_at
    phase = lambda a, b: [dt for t, dt in probe_log if a <= t < b]  # noqa: E731
    sizes = [s for p in pollers for s in p["sizes"]]
    polled = sum(p["polls"] for p in pollers)
    poll_s = raise_at - start_at
    steady = [(t, n) for p in pollers for t, n in p["poll_log"] if start_at + 1 <= t < raise_at]
    ops = 0.0
    for p in pollers:
        pts = [(t, n) for t, n in p["poll_log"] if start_at + 1 <= t < raise_at]
        if len(pts) > 1:
            ops += (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    published = sorted(t for p in pollers for t in p["published"])
    return {
        "world": world, "layout": f"TP {TP} x PP {layout_for(world).pp} x DP {layout_for(world).dp}",
        "poll_scale": poll_scale, "target_ops": rate, "ops": ops, "conns": args.conns * args.procs,
        "gen_s": max(p["gen_s"] for p in pollers),
        "payload_min": min(sizes), "payload_med": statistics.median(sizes), "payload_max": max(sizes),
        "payload_total": sum(sizes) + coord.get("own_payload", 0),
        "lat_base": (_pct(phase(baseline_from, baseline_end), 0.5), _pct(phase(baseline_from, baseline_end), 0.99),
                     len(phase(baseline_from, baseline_end))),
        "lat_poll": (_pct(phase(start_at + 1, t_raise), 0.5), _pct(phase(start_at + 1, t_raise), 0.99), len(phase(start_at + 1, t_raise))),
        "lat_incident": (_pct(phase(t_raise, t_stop), 0.5), _pct(phase(t_raise, t_stop), 0.99), len(phase(t_raise, t_stop)))
        if incident else None,
        "published_all_s": (published[-1] - t_raise) if incident and published else None,
        "published_n": len(published),
        "trace_s": (t_trace - t_raise) if t_trace else None,
        "coord_s": (coord["t_done"] - t_raise) if coord else None,
        "coord_rss_before": coord.get("rss_before"), "coord_rss_peak": coord.get("rss_peak"),
        "encode_full_s": coord.get("encode_full_s"), "raw_full_bytes": coord.get("raw_full_bytes"),
        "verdict": coord.get("result", {}), "culprit": culprit, "spans": spans, "polled": polled, "poll_s": poll_s,
        "keep": _keep(world), "steady_points": len(steady), "bulk_same": coord.get("bulk_same"), "phases": coord.get("phases", {}),
    }


def _keep(world: int) -> int:
    from fr_otel.agent.payload import entries_per_group

    return entries_per_group(KEEP, world)


def _ms(x: float | None) -> str:
    return "-" if x is None or x != x else f"{1000 * x:.1f}"


def report(r: dict[str, Any]) -> None:
    mib = 2**20
    print(f"\n== {r['world']} ranks ({r['layout']}), polling x{r['poll_scale']:g}: {r['conns']} store connections ==")
    print(f"  store ops/s from polling: target {r['target_ops']:,.0f}, achieved {r['ops']:,.0f}")
    b, p, i = r["lat_base"], r["lat_poll"], r["lat_incident"]
    print(f"  other clients' store call latency p50/p99 ms: baseline {_ms(b[0])}/{_ms(b[1])} (n={b[2]}), "
          f"polling {_ms(p[0])}/{_ms(p[1])} (n={p[2]})" + (f", incident {_ms(i[0])}/{_ms(i[1])} (n={i[2]})" if i else ""))
    print(f"  payload bytes per rank ({r['keep']} completed entries per group): min {r['payload_min']:,}, median {r['payload_med']:,.0f}, max {r['payload_max']:,}; "
          f"total {r['payload_total'] / mib:.1f} MiB (2000-entry recorder {r['raw_full_bytes'] or 0:,} B, encoded "
          f"in {_ms(r['encode_full_s'])} ms per rank)")
    if r["trace_s"] is not None or r["coord_s"] is not None:
        v = r["verdict"]
        ok = v.get("culprits") == [r["culprit"]]
        print(f"  every payload published {r['published_all_s'] or 0:.1f} s after the raise ({r['published_n']} ranks); "
              f"trace at the receiver {r['trace_s'] or float('nan'):.1f} s after the raise; coordinator done "
              f"{r['coord_s'] or float('nan'):.1f} s; coordinator peak RSS {(r['coord_rss_peak'] or 0) / mib:.0f} MiB "
              f"(before {(r['coord_rss_before'] or 0) / mib:.0f} MiB)")
        phases = dict(r["phases"])
        cpu = phases.pop("cpu", float("nan"))
        print(f"  coordinator: {cpu:.1f} s of CPU in {r['coord_s'] or float('nan'):.1f} s of wall (the simulated ranks, "
              "the store and the probe share its 2 cores); phases (s): "
              + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())
              + ("" if r["bulk_same"] else "  [WARNING: bulk payloads differ from trimming all 2000 entries]"))
        print(f"  verdict {v.get('verdict')}, culprits {v.get('culprits')} "
              f"({'names the injected culprit' if ok else 'FAIL: expected [' + str(r['culprit']) + ']'}), "
              f"{r['spans']} spans received")
        goals = [("trace <= 60 s", r["trace_s"] is not None and r["trace_s"] <= GOAL_TRACE_S),
                 ("coordinator < 2 GiB", (r["coord_rss_peak"] or 0) < GOAL_MEM),
                 ("store p99 < 50 ms", i is not None and i[1] < GOAL_P99_S)]
        print("  goals: " + ", ".join(f"{g} {'MET' if ok else 'MISSED'}" for g, ok in goals))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, action="append", help="simulated world size (repeatable; default 1024 4096 16384)")
    ap.add_argument("--poll-scale", type=float, action="append",
                    help="also run polling only, at this many times the rate, for the first world size "
                         "(a stand-in for that many times the ranks)")
    ap.add_argument("--procs", type=int, default=2, help="poller processes")
    ap.add_argument("--conns", type=int, default=32, help="store connections per poller process")
    ap.add_argument("--poll-interval", type=float, default=1.0)
    ap.add_argument("--steady", type=float, default=6.0, help="seconds of polling before the incident")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    rows = []
    for world in args.ranks or [1024, 4096, 16384]:
        r = run(world, args)
        report(r)
        rows.append(r)
        for scale in (args.poll_scale or []) if world == (args.ranks or [1024])[0] else []:
            s = run(world, args, poll_scale=scale, incident=False)
            report(s)
            rows.append(s)
    print("\n== summary ==")
    print(f"{'ranks':>6} {'poll ops/s':>11} {'p99 base/poll/incident ms':>27} {'payload/rank':>12} {'total MiB':>9} "
          f"{'trace s':>8} {'coord MiB':>9}")
    for r in rows:
        i = r["lat_incident"]
        print(f"{r['world'] * r['poll_scale']:>6.0f} {r['ops']:>11,.0f} "
              f"{_ms(r['lat_base'][1]) + '/' + _ms(r['lat_poll'][1]) + '/' + (_ms(i[1]) if i else '-'):>27} "
              f"{r['payload_med']:>12,.0f} {r['payload_total'] / 2**20:>9.1f} "
              f"{(r['trace_s'] if r['trace_s'] is not None else float('nan')):>8.1f} "
              f"{(r['coord_rss_peak'] or 0) / 2**20:>9.0f}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
