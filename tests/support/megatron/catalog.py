"""The scenarios the diagnosis tests run: healthy snapshots, stragglers, and every fault injector.

The default job is 32 ranks (TP 2 x PP 4 x DP 4, two virtual chunks per stage, four
microbatches), one pipeline stage per 8-GPU node; mismatches use TP 4 x PP 2 x DP 4 so that
a tensor-parallel group has a minority. Each builder returns a :class:`Scenario` whose truth
is what the injected fault makes true.
"""

from __future__ import annotations

from .engine import Faults, Target
from .layout import DP, PP, TP, Layout
from .scenarios import Scenario, Truth, job, pull
from .schedule import Call, Coll, Timing

__all__ = [
    "cpu_stop", "dead_node", "gpu_stall", "healthy_snapshot", "mismatch", "never_posts_recv", "quiescent",
    "slow_host", "straggler", "truncated_bystander", "two_faults",
]

TIMING = Timing(microbatches=4)
CAPACITY = 256  # ring entries per rank: the ring wraps within a few steps
ON_DEMAND_S = 30.0  # an operator (or the debug server) pulls the dumps this long after the fault
ON_TIMEOUT_S = 600.0  # NCCL dumps itself (only-active, with TORCH_INCLUDE_ONLY_ACTIVE) when its watchdog fires


def layout_3d() -> Layout:
    return Layout(tp=2, pp=4, dp=4, vpp=2)


def layout_tp4() -> Layout:
    return Layout(tp=4, pp=2, dp=4, vpp=2)


def healthy_snapshot(phase: float = 0.4, *, capacity: int = CAPACITY, only_active: bool = False, seed: int = 0,
                     layout: Layout | None = None) -> Scenario:
    """No fault; dumps pulled ``phase`` of the way into a step, a few ms apart."""
    lay = layout or layout_3d()
    run = job(lay, TIMING, capacity, seed=seed, key=("healthy",))
    last = max(run.step_start)
    start, period = run.step_start[last - 1], run.step_start[last] - run.step_start[last - 1]
    at = start + phase * period
    return Scenario(f"healthy@{phase:.2f}", run, pull(range(lay.world), at, seed=seed), Truth("healthy"),
                    capacity, only_active)


def straggler(rank: int = 11, extra_s: float = 0.6, phase: float = 0.55, *, capacity: int = 512) -> Scenario:
    """Rank ``rank`` spends ``extra_s`` of CPU before its first reduce_scatter every step (~40% of a
    step): the job runs, its data-parallel peers wait for it each step. Dumped mid-step; the ring
    holds enough steps (a once-a-step op must be seen late at least five times)."""
    lay = layout_3d()
    run = job(lay, TIMING, capacity, Faults(extra_cpu={rank: ("dp_rs", extra_s)}), key=("straggler", rank, extra_s))
    last = max(run.step_start)
    start, period = run.step_start[last - 1], run.step_start[last] - run.step_start[last - 1]
    return Scenario(f"straggler{rank}@{phase:.2f}", run, pull(range(lay.world), start + phase * period),
                    Truth("straggler", {rank: "straggler"}, DP), capacity)


def quiescent(rank: int = 11, extra_s: float = 0.6, *, capacity: int = 512) -> Scenario:
    """The straggler job dumped after its last step finished: nothing in flight anywhere."""
    s = straggler(rank, extra_s, capacity=capacity)
    end = max(s.run.cpu_end.values()) + 0.5
    s.name = f"quiescent-straggler{rank}"
    s.dump_at = pull(range(s.run.layout.world), end)
    return s


def _hang(name: str, faults: Faults, truth: Truth, *, layout: Layout | None = None, after_s: float = ON_DEMAND_S,
          capacity: int = CAPACITY, only_active: bool = False, missing: frozenset[int] = frozenset(),
          truncated: frozenset[int] = frozenset(), fault_step: int = 4) -> Scenario:
    """``name`` says everything the faults do (it keys the shared run)."""
    lay = layout or layout_3d()
    run = job(lay, TIMING, capacity, faults, fault_step=fault_step, key=(name, fault_step))
    when = max(run.fault_time.values(), default=None)
    if when is None:  # a dead node: its time of death
        when = max(faults.dead.values())
    return Scenario(name, run, pull(range(lay.world), when + after_s), truth, capacity, only_active, missing, truncated)


def gpu_stall(rank: int = 13, *, step: int = 4, after_s: float | None = None, only_active: bool = False,
              capacity: int = CAPACITY) -> Scenario:
    """Rank ``rank``'s GPU hangs inside a tensor-parallel all_reduce its peer has finished. Pulled
    on demand after 30 s, or (only-active) by NCCL's own dump when its watchdog fires."""
    return _hang(f"gpu_stall{rank}@{step}", Faults(gpu_stall={rank: Target(step, "tp_fwd", 3)}),
                 Truth("hang", {rank: "not_completed"}, TP, step), after_s=_after(after_s, only_active),
                 only_active=only_active, capacity=capacity, fault_step=step)


def cpu_stop(rank: int = 10, tag: str = "tp_bwd", nth: int = 1, *, step: int = 4, after_s: float | None = None,
             only_active: bool = False, capacity: int = CAPACITY) -> Scenario:
    """Rank ``rank``'s CPU never reaches an op (a stuck data loader, a held GIL)."""
    desc = {"tp_bwd": TP, "tp_fwd": TP, "get_batch": TP, "dp_rs": DP, "dp_ag": DP}[tag]
    return _hang(f"cpu_stop{rank}:{tag}#{nth}@{step}", Faults(cpu_stop={rank: Target(step, tag, nth)}),
                 Truth("hang", {rank: "not_enqueued"}, desc, step), after_s=_after(after_s, only_active),
                 only_active=only_active, capacity=capacity, fault_step=step)


def _after(after_s: float | None, only_active: bool) -> float:
    return after_s if after_s is not None else ON_TIMEOUT_S if only_active else ON_DEMAND_S


def never_posts_recv(rank: int = 21, nth: int = 2, *, step: int = 4) -> Scenario:
    """A middle stage never posts its next send/recv batch (its CPU is elsewhere)."""
    return _hang(f"no_recv{rank}#{nth}@{step}", Faults(cpu_stop={rank: Target(step, "p2p_fwd", nth)}),
                 Truth("hang", {rank: "not_enqueued"}, PP, step), fault_step=step)


def dead_node(node: int = 2, *, step: int = 4, phase: float = 0.5) -> Scenario:
    """Every rank of one node dies mid-step; they leave no dumps."""
    lay = layout_3d()
    probe = job(lay, TIMING, CAPACITY, fault_step=step, key=("healthy",))
    start = probe.step_start[step]
    period = probe.step_start[step] - probe.step_start[step - 1]
    dead = lay.node_ranks(node)
    faults = Faults(dead={r: start + phase * period for r in dead})
    return _hang(f"dead_node{node}@{step}+{phase}", faults, Truth("hang", {r: "missing_dump" for r in dead}, PP, step),
                 missing=frozenset(dead), fault_step=step)


def two_faults(*, step: int = 4) -> Scenario:
    """Two independent faults in two pipelines: rank 9's CPU stops, rank 22's GPU stalls."""
    faults = Faults(cpu_stop={9: Target(step, "tp_bwd", 2)}, gpu_stall={22: Target(step, "tp_fwd", 3)})
    return _hang(f"two_faults@{step}", faults, Truth("hang", {9: "not_enqueued", 22: "not_completed"}, TP, step),
                 fault_step=step)


def mismatch(kind: str = "plain", rank: int = 6, *, step: int = 4) -> Scenario:
    """Rank ``rank`` calls a collective with other sizes (plain) or dtypes (coalesced): nobody finishes it."""
    if kind == "plain":
        where = Target(step, "tp_fwd", 2)

        def change(c: Coll) -> Coll:
            return c._replace(calls=(c.calls[0]._replace(sizes=((1024, 1, 4096),)),))
        desc = TP
    elif kind == "coalesced":  # get_batch's coalesced broadcasts in the tensor-parallel group
        where = Target(step, "get_batch", 1)

        def change(c: Coll) -> Coll:
            return c._replace(calls=(c.calls[0], Call(c.calls[1].op, c.calls[1].sizes, "Int"), c.calls[2]))
        desc = TP
    else:  # the distributed optimizer's coalesced reduce_scatter over data-parallel ranks
        where = Target(step, "dp_rs", 0)

        def change(c: Coll) -> Coll:
            return c._replace(calls=(c.calls[0], Call(c.calls[1].op, c.calls[1].sizes, "BFloat16")))
        desc = DP
    return _hang(f"mismatch-{kind}{rank}@{step}", Faults(calls={rank: (where, change)}),
                 Truth("desync", {rank: "mismatch"}, desc, step), layout=layout_tp4(), fault_step=step)


def truncated_bystander(culprit: int = 10, bystander: int = 11, *, step: int = 4) -> Scenario:
    """Rank ``culprit``'s CPU stops; ``bystander`` (its tensor-parallel peer, which kept pace and now
    waits on it) has a dump cut short."""
    s = cpu_stop(culprit, step=step)
    s.name = f"truncated{bystander}+cpu_stop{culprit}"
    s.truncated = frozenset({bystander})
    # The group the fault hit (TP) shows in no readable dump: the culprit's only TP peer is the bystander.
    s.truth = Truth("hang", {culprit: "not_enqueued"}, None, step, unknown=(bystander,))
    return s


def slow_host(slow: tuple[int, ...] = (2, 3), *, from_step: int = 12, steps: int = 20,
              extra_s: float | tuple[float, ...] = 0.45, spread_s: float = 0.1, seed: int = 5) -> Scenario:
    """The slow-host job: six data-parallel ranks, two per host, one gradient all_reduce per step; from
    ``from_step`` on, host 1's two ranks take ``extra_s`` (give or take ``spread_s``; several: in turn)
    more CPU before it, equally slow, so each is the last to arrive about half the time."""
    from .engine import simulate

    lay = Layout(tp=1, pp=1, dp=6, gpus_per_node=2)
    timing = Timing(microbatches=2, optimizer="ddp")
    faults = Faults(extra_cpu={r: ("dp_rs", extra_s, from_step, spread_s) for r in slow})
    run = simulate(lay, steps, timing, faults, seed=seed)
    end = max(run.cpu_end.values()) + 0.5
    return Scenario("slow_host", run, pull(range(lay.world), end), Truth("straggler", {r: "straggler" for r in slow},
                                                                          DP, from_step))
