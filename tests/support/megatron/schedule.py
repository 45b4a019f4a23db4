"""What each rank's training loop issues, step after step: a Megatron-style interleaved 1F1B step.

Written from how such a step works, not from Megatron's code. Per step, a rank:

- runs its pipeline schedule: ``M`` microbatches through ``V`` virtual chunks of its stage,
  warm-up forwards first (more on earlier stages), then one forward and one backward in turn,
  then the remaining backwards. Each forward takes its input from the previous stage (stage 0's
  later chunks from the last stage's earlier chunk) and sends its output on; backwards run the
  other way. The send of one unit's output is posted together with the recv of the next unit's
  input (one batch, as ``batch_isend_irecv`` does), which keeps the pipeline free of deadlock;
- inside each chunk, per layer, GPU work and a tensor-parallel all_reduce (forward and backward);
- on the stages that need data (first and last), ``get_batch``: tensor-parallel rank 0 loads the
  microbatch (CPU time, late by design) and broadcasts it under a coalescing manager;
- then the distributed optimizer: a coalesced reduce_scatter of the gradient buckets over the
  data-parallel group, the embedding all_reduce between first and last stage, the gradient
  norm over the model-parallel group (its ``.item()`` is where the CPU waits for the GPU), the
  optimizer kernels and a coalesced all_gather of the parameters.

Instructions are plain records; the engine (:mod:`.engine`) gives them times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Union

from .layout import DP, EMB, MP, PP, TP, Group, Layout

__all__ = ["Call", "Coll", "Cpu", "Kernel", "P2P", "P2POp", "Sync", "Timing", "Instr", "program", "units", "warmup"]


class Call(NamedTuple):
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtype: str


class Cpu(NamedTuple):
    """CPU-only time (Python, data loading); ``tag`` says which."""

    dt: float
    tag: str = "python"


class Kernel(NamedTuple):
    """GPU work launched from the CPU, after ``cpu`` seconds of Python that prepares it."""

    dt: float
    tag: str = "compute"
    cpu: float = 0.0


class Coll(NamedTuple):
    """A collective (several calls: a coalesced group, one seq, one entry per call plus ``coalesced``)."""

    group: Group
    calls: tuple[Call, ...]
    dt: float
    tag: str
    coalesced: bool = False


class P2POp(NamedTuple):
    kind: str  # "send" | "recv"
    group: Group
    peer: int  # global rank on the other side
    sizes: tuple[tuple[int, ...], ...]
    dtype: str
    label: str  # as recorded: "send 1->2" (group-local ranks)


class P2P(NamedTuple):
    """Send/recv posted together; the stream waits for all of them."""

    ops: tuple[P2POp, ...]
    dt: float
    tag: str


class Sync(NamedTuple):
    """The CPU waits for the GPU (``.item()``)."""

    tag: str = "sync"


Instr = Union[Cpu, Kernel, Coll, P2P, Sync]


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds. GPU work is long next to the CPU's launch cost, so the CPU runs ahead of the GPU."""

    microbatches: int = 8
    layers: int = 1  # per virtual chunk
    fwd_s: float = 0.012  # GPU per layer and microbatch
    bwd_s: float = 0.024
    launch_s: float = 0.00003  # CPU per launched op
    python_s: float = 0.0004  # CPU per layer
    tp_s: float = 0.0008  # a tensor-parallel all_reduce on the GPU
    p2p_s: float = 0.001
    data_load_s: float = 0.06  # tensor-parallel rank 0, per microbatch, on the stages that read data
    buckets: int = 2
    rs_s: float = 0.025  # per bucket
    ag_s: float = 0.015
    optimizer_s: float = 0.03
    hidden: int = 4096
    seq_len: int = 2048
    optimizer: str = "distributed"  # reduce_scatter + all_gather per step; "ddp": one gradient all_reduce


def warmup(stage: int, stages: int, chunks: int, microbatches: int) -> int:
    """Forwards a stage runs before its first backward: more on earlier stages."""
    total = microbatches * chunks
    if chunks > 1:
        return min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    return min(stages - stage - 1, total)


def units(stage: int, stages: int, chunks: int, microbatches: int) -> list[tuple[str, int, int]]:
    """The stage's schedule: ("F"|"B", microbatch, chunk) in execution order (interleaved 1F1B)."""
    total = microbatches * chunks
    first = warmup(stage, stages, chunks, microbatches)

    def at(k: int, backward: bool) -> tuple[int, int]:
        group = k // stages
        chunk = group % chunks
        if backward:
            chunk = chunks - 1 - chunk
        return (k // (stages * chunks)) * stages + k % stages, chunk

    order = [("F", *at(k, False)) for k in range(first)]
    for i in range(total - first):
        order.append(("F", *at(first + i, False)))
        order.append(("B", *at(i, True)))
    order.extend(("B", *at(k, True)) for k in range(total - first, total))
    return order


def _iterations(order: list[tuple[str, int, int]], first: int) -> list[list[tuple[str, int, int]]]:
    """The schedule's loop iterations: one forward each in warm-up, a forward and a backward in the
    steady phase, one backward each in cool-down. After each iteration one batch sends its outputs
    and receives the next iteration's inputs (both directions at once: no two stages can each wait
    to send before receiving)."""
    steady = len(order) - 2 * first  # forward-backward pairs
    out = [[u] for u in order[:first]]
    out.extend([order[first + 2 * i], order[first + 2 * i + 1]] for i in range(steady // 2))
    out.extend([u] for u in order[first + steady // 2 * 2:])
    return out


def _neighbours(layout: Layout, rank: int, chunk: int, backward: bool) -> tuple[int | None, int | None]:
    """(where this unit's input comes from, where its output goes): global ranks or None."""
    p, last, first_chunk, last_chunk = layout.stage(rank), layout.pp - 1, chunk == 0, chunk == layout.vpp - 1
    prev_stage = None if p == 0 and first_chunk else (p - 1) % layout.pp
    next_stage = None if p == last and last_chunk else (p + 1) % layout.pp
    prev = None if prev_stage is None else layout.stage_rank(rank, prev_stage)
    nxt = None if next_stage is None else layout.stage_rank(rank, next_stage)
    return (nxt, prev) if backward else (prev, nxt)


def program(layout: Layout, rank: int, t: Timing) -> list[Instr]:
    """Everything ``rank`` issues in one training step (every step issues the same)."""
    tp_rank, _, stage = layout.coords(rank)
    tp = layout.group(rank, TP)
    pp = layout.group(rank, PP)
    act = ((t.seq_len, 1, t.hidden),)
    out: list[Instr] = [Cpu(0.002, "zero_grad")]
    reads_data = stage in (0, layout.pp - 1)

    def io(unit: tuple[str, int, int]) -> tuple[P2POp | None, P2POp | None]:
        kind, _, chunk = unit
        src, dst = _neighbours(layout, rank, chunk, kind == "B")
        if pp is None:
            return None, None
        me = pp.local(rank)
        return (None if src is None else P2POp("recv", pp, src, act, "BFloat16", f"recv {me}<-{pp.local(src)}"),
                None if dst is None else P2POp("send", pp, dst, act, "BFloat16", f"send {me}->{pp.local(dst)}"))

    def batch(ops: list[P2POp | None], tag: str) -> None:
        real = tuple(o for o in ops if o is not None)
        if real:
            out.append(P2P(real, t.p2p_s, tag))

    iterations = _iterations(units(stage, layout.pp, layout.vpp, t.microbatches),
                             warmup(stage, layout.pp, layout.vpp, t.microbatches))
    batch([io(u)[0] for u in iterations[0]] if iterations else [], "p2p_fwd")
    for i, it in enumerate(iterations):
        for unit in it:
            kind, mb, chunk = unit
            backward = kind == "B"
            if kind == "F" and reads_data and chunk in (0, layout.vpp - 1):
                if tp_rank == 0:
                    out.append(Cpu(t.data_load_s, "data"))
                if tp is not None and layout.tp > 1:
                    call = Call("broadcast", ((1, t.seq_len),), "Long")
                    out.append(Coll(tp, (call, call, call), 0.0002, "get_batch", coalesced=True))
            for _ in range(t.layers):
                for part in (0, 1):  # attention, then MLP
                    out.append(Kernel((t.bwd_s if backward else t.fwd_s) / 2, "compute", t.python_s / 2))
                    if tp is not None and layout.tp > 1:
                        out.append(Coll(tp, (Call("all_reduce", act, "BFloat16"),), t.tp_s,
                                        "tp_bwd" if backward else "tp_fwd"))
        following = iterations[i + 1] if i + 1 < len(iterations) else []
        batch([io(u)[1] for u in it] + [io(u)[0] for u in following],
              "p2p_bwd" if it[-1][0] == "B" else "p2p_fwd")
    out.extend(_optimizer(layout, rank, t))
    return out


def _optimizer(layout: Layout, rank: int, t: Timing) -> list[Instr]:
    out: list[Instr] = []
    dp, emb, mp = layout.group(rank, DP), layout.group(rank, EMB), layout.group(rank, MP)
    bucket = ((t.hidden * t.hidden // layout.tp,),)
    shard = ((t.hidden * t.hidden // layout.tp // layout.dp,),)
    ddp = t.optimizer == "ddp"
    if dp is not None and layout.dp > 1 and ddp:
        out.append(Coll(dp, (Call("all_reduce", bucket, "Float"),), t.rs_s * t.buckets, "dp_rs"))
    elif dp is not None and layout.dp > 1:
        calls = tuple(Call("_reduce_scatter_base", bucket, "Float") for _ in range(t.buckets))
        out.append(Coll(dp, calls, t.rs_s * t.buckets, "dp_rs", coalesced=True))
    if emb is not None:
        out.append(Coll(emb, (Call("all_reduce", ((32000 // layout.tp, t.hidden),), "Float"),), 0.004, "emb"))
    if mp is not None and len(mp.ranks) > 1:
        out.append(Coll(mp, (Call("all_reduce", ((1,),), "Float"),), 0.0003, "grad_norm"))
    out.append(Sync("grad_norm"))
    out.append(Kernel(t.optimizer_s, "optimizer"))
    if dp is not None and layout.dp > 1 and not ddp:
        calls = tuple(Call("_all_gather_base", shard, "BFloat16") for _ in range(t.buckets))
        out.append(Coll(dp, calls, t.ag_s * t.buckets, "dp_ag", coalesced=True))
    out.append(Cpu(0.003, "log"))
    return out
