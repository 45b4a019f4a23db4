"""A causal model of the job: when each rank's CPU issues each op, and when its GPU finishes it.

Each rank has a CPU that walks its program and a GPU stream that runs what the CPU launched,
in order. The CPU runs ahead of the stream until it must wait: at a ``Sync`` (``.item()``) or
when ``queue_depth`` launched ops have not started yet (the launch queue is full). A
collective finishes on every member once all members' streams reached it (plus its own
time); a send/recv once both sides did. Everything else follows: a rank whose CPU stops
leaves its peers' streams blocked in the next op they share with it, their CPUs block at
their next sync, and so on through the job, exactly as far as causality carries it.

Faults change the model, never the outcome directly: a CPU that stops before an op, a GPU
stuck in a collective it has already served (its peers finish it, it never does), a
collective whose calls disagree (nobody finishes it), ranks that die at a moment (their ops
in flight never finish, anywhere), extra CPU time before an op every step. Times are seconds
from the job's start; ``INF`` is never.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

from .layout import Group, Layout
from .schedule import Call, Coll, Cpu, Instr, Kernel, P2P, Sync, Timing, program

__all__ = ["INF", "Faults", "Record", "Run", "Target", "simulate"]

INF = float("inf")
_KERNEL, _COLL, _P2P = 0, 1, 2


class Target(NamedTuple):
    """The ``nth`` instruction tagged ``tag`` in training step ``step`` (of one rank's program)."""

    step: int
    tag: str
    nth: int = 0


@dataclass(slots=True)
class Record:
    """One recorder entry as the rank made it; ``done_at`` is when its GPU finished it (INF: never)."""

    group: Group
    op: str  # "all_reduce", "send 1->2", "coalesced"
    seq: int  # collective_seq_id
    p2p_seq: int
    is_p2p: bool
    sizes: tuple[tuple[int, ...], ...]
    dtype: str
    created: float
    step: int
    tag: str
    done_at: float = INF


@dataclass(slots=True)
class _Item:
    kind: int
    dt: float
    created: float
    keys: tuple = ()
    records: list[Record] = field(default_factory=list)
    start: float | None = None
    stall: bool = False


@dataclass(slots=True)
class _Meet:
    """Where ranks meet: a collective instance or one send/recv pair."""

    need: int
    dt: float
    reach: dict[int, float] = field(default_factory=dict)
    end: float | None = None
    calls: tuple[Call, ...] | None = None  # what the first member brought: any other call breaks it
    broken: bool = False


@dataclass(slots=True)
class _Rank:
    base: list[Instr]  # one step's program
    steps: int
    pc: int = 0  # over all steps
    cpu: float = 0.0
    stream: list[_Item] = field(default_factory=list)
    done: int = 0  # stream items finished
    free: float = 0.0  # when the stream finished its last finished item
    halt_at: int | None = None  # pc the CPU never passes
    stall_at: int | None = None  # pc of the collective its GPU never finishes
    dead_at: float | None = None
    override: dict[int, Instr] = field(default_factory=dict)  # pc -> a changed instruction (mismatch)
    extra: tuple[frozenset[int], tuple[float, ...], int, float] | None = None  # (positions, CPU s in turn, from, spread s)
    extra_done: int = -1  # last pc the extra time was spent before
    extra_count: int = 0  # how many times it was
    prep_done: int = -1  # last pc whose launch preparation (Kernel.cpu) was spent
    records: list[Record] = field(default_factory=list)
    seq: dict[str, int] = field(default_factory=dict)
    p2p_seq: dict[str, int] = field(default_factory=dict)
    channel: dict[tuple[str, int, int], int] = field(default_factory=dict)


@dataclass
class Faults:
    """What goes wrong, per rank."""

    cpu_stop: dict[int, Target] = field(default_factory=dict)  # the CPU never issues it
    gpu_stall: dict[int, Target] = field(default_factory=dict)  # its GPU never finishes it (peers do)
    calls: dict[int, tuple[Target, Callable[[Coll], Coll]]] = field(default_factory=dict)  # mismatch
    dead: dict[int, float] = field(default_factory=dict)  # rank -> when it dies
    # CPU seconds before every op so tagged: (tag, seconds[, from step, give or take seconds]); seconds may be a
    # tuple, taken in turn (from a place of its own per rank): a CPU quota that runs out now and then
    extra_cpu: dict[int, tuple] = field(default_factory=dict)


@dataclass
class Run:
    """The simulated job: every rank's records, and where each fault landed."""

    layout: Layout
    timing: Timing
    records: dict[int, list[Record]]
    step_start: dict[int, float]  # step -> when rank 0's CPU began it
    landed: dict[int, Instr] = field(default_factory=dict)  # rank -> the instruction its fault hit
    fault_time: dict[int, float] = field(default_factory=dict)  # rank -> when its CPU reached its fault
    cpu_end: dict[int, float] = field(default_factory=dict)

    def step_of(self, t: float) -> int:
        return max((s for s, start in self.step_start.items() if start <= t), default=0)


def position(base: list[Instr], target: Target) -> int:
    """The pc of ``target`` in a program made of ``base`` repeated."""
    hits = [i for i, ins in enumerate(base) if ins.tag == target.tag]
    if target.nth >= len(hits):
        raise ValueError(f"no {target.tag} #{target.nth} in the program")
    return target.step * len(base) + hits[target.nth]


def simulate(layout: Layout, steps: int, timing: Timing | None = None, faults: Faults | None = None,
             *, seed: int = 0, queue_depth: int = 48) -> Run:
    """Run ``steps`` training steps of ``layout`` under ``faults``; deterministic for a seed."""
    t = timing or Timing()
    f = faults or Faults()
    rng = random.Random(seed)
    jitter = [rng.uniform(0.97, 1.03) for _ in range(997)]
    ranks: dict[int, _Rank] = {}
    landed: dict[int, Instr] = {}
    for r in range(layout.world):
        base = program(layout, r, t)
        st = ranks[r] = _Rank(base, steps, dead_at=f.dead.get(r))
        if r in f.calls:
            target, change = f.calls[r]
            pc = position(base, target)
            landed[r] = st.override[pc] = change(base[pc % len(base)])  # type: ignore[arg-type]
        if r in f.cpu_stop:
            st.halt_at = position(base, f.cpu_stop[r])
            landed[r] = base[st.halt_at % len(base)]
        if r in f.gpu_stall:
            st.stall_at = position(base, f.gpu_stall[r])
            landed[r] = base[st.stall_at % len(base)]
        if r in f.extra_cpu:
            tag, dt, since, spread = (*f.extra_cpu[r], 0, 0.0)[:4]
            st.extra = (frozenset(i for i, ins in enumerate(base) if ins.tag == tag),
                        dt if isinstance(dt, tuple) else (dt,), since, spread)
    meets: dict[tuple, _Meet] = {}
    fault_time: dict[int, float] = {}
    step_start: dict[int, float] = {}
    dirty = set(ranks)
    launch = t.launch_s

    def issue(r: int, st: _Rank, ins: Instr, step: int) -> None:
        created = st.cpu
        kind = type(ins)
        if kind is Kernel:
            item = _Item(_KERNEL, ins.dt * jitter[(st.pc * 31 + r) % 997], created)
        elif kind is Coll:
            g = ins.group
            name = g.name
            seq = st.seq[name] = st.seq.get(name, 0) + 1
            key = ("c", name, seq)
            m = meets.get(key)
            if m is None:
                m = meets[key] = _Meet(len(g.ranks), ins.dt, calls=ins.calls)
            elif m.calls != ins.calls:
                m.broken = True  # different sizes or dtypes: nobody finishes it
            item = _Item(_COLL, ins.dt, created, (key,), stall=st.stall_at == st.pc)
            p2p = st.p2p_seq.get(name, 0)
            recs = item.records
            for i, c in enumerate(ins.calls):
                recs.append(Record(g, c.op, seq, p2p, False, c.sizes, c.dtype, created + i * 2e-6, step, ins.tag))
            if ins.coalesced:
                recs.append(Record(g, "coalesced", seq, p2p, False, (), "", created + len(ins.calls) * 2e-6, step,
                                   ins.tag))
        else:
            keys = []
            item = _Item(_P2P, ins.dt, created)
            for i, op in enumerate(ins.ops):
                g = op.group
                src, dst = (r, op.peer) if op.kind == "send" else (op.peer, r)
                ch = (g.name, src, dst)
                k = st.channel[ch] = st.channel.get(ch, 0) + 1
                key = ("p", g.name, src, dst, k)
                if key not in meets:
                    meets[key] = _Meet(2, ins.dt)
                keys.append(key)
                n = st.p2p_seq[g.name] = st.p2p_seq.get(g.name, 0) + 1
                item.records.append(Record(g, op.label, st.seq.get(g.name, 0), n, True, op.sizes, op.dtype,
                                           created + i * 2e-6, step, ins.tag))
            item.keys = tuple(keys)
        st.records.extend(item.records)
        st.stream.append(item)
        st.cpu = created + launch

    def advance_cpu(r: int, st: _Rank) -> bool:
        moved = False
        base, n = st.base, len(st.base)
        end = n * st.steps
        while st.pc < end:
            pc = st.pc
            if st.halt_at is not None and pc >= st.halt_at:
                fault_time.setdefault(r, st.cpu)
                break
            if st.dead_at is not None and st.cpu >= st.dead_at:
                break
            step, at = divmod(pc, n)
            if at == 0 and r == 0:
                step_start.setdefault(step, st.cpu)
            ins = st.override.get(pc) or base[at]
            if st.extra is not None and at in st.extra[0] and st.extra_done < pc and step >= st.extra[2]:
                wobble = jitter[(pc * 7 + r * 13) % 997] - 1.0  # within +-0.03
                turns = st.extra[1]
                st.cpu += turns[(st.extra_count + 3 * r) % len(turns)] + st.extra[3] * wobble / 0.03
                st.extra_done, st.extra_count = pc, st.extra_count + 1
            kind = type(ins)
            if kind is Cpu:
                st.cpu += ins.dt
            elif kind is Sync:
                if st.done < len(st.stream):
                    break
                st.cpu = max(st.cpu, st.free)
            else:
                if kind is Kernel and ins.cpu and st.prep_done < pc:
                    st.cpu += ins.cpu  # the Python that prepares the launch (once, even if it then blocks)
                    st.prep_done = pc
                k = len(st.stream)
                if k >= queue_depth:
                    before = st.stream[k - queue_depth].start
                    if before is None:
                        break
                    if before > st.cpu:
                        st.cpu = before
                if st.stall_at == pc or pc in st.override:
                    fault_time.setdefault(r, st.cpu)
                issue(r, st, ins, step)
            st.pc = pc + 1
            moved = True
        return moved

    def advance_stream(r: int, st: _Rank) -> bool:
        moved = False
        stream = st.stream
        while st.done < len(stream):
            it = stream[st.done]
            reach = st.free if st.free > it.created else it.created
            if st.dead_at is not None and reach >= st.dead_at:
                break
            if it.kind == _KERNEL:
                it.start = reach
                end = reach + it.dt
            else:
                if it.start is None:
                    it.start = reach
                    for key in it.keys:
                        m = meets[key]
                        m.reach[r] = reach
                        if len(m.reach) == m.need:
                            _finish(m, f.dead)
                            dirty.update(m.reach)
                end = 0.0
                for key in it.keys:
                    e = meets[key].end
                    if e is None:
                        break
                    end = e if e > end else end
                else:
                    e = 0.0
                if e is None or it.stall:
                    break
            if st.dead_at is not None and end > st.dead_at:
                break
            st.free = end
            for rec in it.records:
                rec.done_at = end
            st.done += 1
            moved = True
        return moved

    while dirty:
        r = dirty.pop()
        st = ranks[r]
        while advance_cpu(r, st) | advance_stream(r, st):
            pass
    return Run(layout, t, {r: st.records for r, st in ranks.items()}, step_start, landed, fault_time,
               {r: st.cpu for r, st in ranks.items()})


def _finish(m: _Meet, dead: dict[int, float]) -> None:
    if m.broken:
        return
    end = max(m.reach.values()) + m.dt
    if any(r in dead and dead[r] < end for r in m.reach):
        return
    m.end = end
