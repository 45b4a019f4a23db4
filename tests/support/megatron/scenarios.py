"""Named situations of a simulated 3D-parallel job, each with its ground truth.

A scenario is a simulated run, the moment each rank's dump was pulled (a few ms apart: dumps
are pulled one rank at a time), the recorder settings (ring size, only-active) and which dumps
are absent or unreadable. ``read()`` parses the dumps in memory through the product's own
reader; ``write()`` puts them on disk (file times = pull times) for the CLI.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from fr_otel import Verdict, analyze, build_job
from fr_otel.read.dump_file import parse_dump_bytes
from fr_otel.read.reader import ReadResult

from .engine import Faults, Run, Target, simulate
from .layout import Layout
from .recorder import dump_bytes, ns, seq_offset
from .schedule import Coll, Instr, Timing, program

__all__ = ["Scenario", "Truth", "job", "pull", "steps_for"]


@dataclass(frozen=True, slots=True)
class Truth:
    """What really happened: the verdict a correct analysis gives and whom it names."""

    verdict: str
    culprits: dict[int, str] = field(default_factory=dict)  # rank -> culprit kind
    group_desc: str | None = None  # where the root cause sits
    step: int | None = None  # the training step the fault hit
    unknown: tuple[int, ...] = ()  # unreadable or absent dumps that are not to blame


@dataclass(slots=True)
class Scenario:
    name: str
    run: Run
    dump_at: dict[int, float]  # rank -> when its dump was pulled (simulated seconds)
    truth: Truth
    capacity: int = 2000
    only_active: bool = False
    missing: frozenset[int] = frozenset()  # no dump at all
    truncated: frozenset[int] = frozenset()  # a dump cut short (unreadable)
    _bytes: dict[int, bytes] | None = None

    def source(self, rank: int) -> str:
        return f"nccl_trace_rank_node{self.run.layout.node(rank):02d}_{rank}"

    def dumps(self) -> dict[int, bytes]:
        """Each rank's dump as pulled (made once per scenario)."""
        if self._bytes is None:
            self._bytes = {}
            for rank, at in self.dump_at.items():
                if rank not in self.missing:
                    data = dump_bytes(self.run, rank, at, capacity=self.capacity, only_active=self.only_active)
                    self._bytes[rank] = data[: len(data) // 2] if rank in self.truncated else data
        return self._bytes

    def read(self, *, dated: bool = True) -> ReadResult:
        """The dumps as the product's reader parses them (in memory, each with its pull time, or with none:
        ``dated`` False, as files copied off the nodes without their dates are)."""
        result = ReadResult()
        for rank, data in self.dumps().items():
            dump = parse_dump_bytes(data, rank, self.source(rank),
                                    dumped_at_ns=ns(self.dump_at[rank]) if dated else None,
                                    problems=result.problems, full=False)
            if dump is not None:
                result.dumps[rank] = dump
        return result

    def verdict(self, *, dated: bool = True) -> Verdict:
        return analyze(build_job(self.read(dated=dated)))

    def step_of(self, group: str, seq: int) -> int | None:
        """The training step collective ``group`` #``seq`` (as the dumps number it) belongs to."""
        for recs in self.run.records.values():
            for rec in recs:
                if rec.group.name == group and not rec.is_p2p and rec.seq + seq_offset(rec.group.desc) == seq:
                    return rec.step
        return None

    def first_seq(self, rank: int, tag: str, step: int) -> int:
        """The seq (as the dumps number it) of ``rank``'s first op tagged ``tag`` in ``step``."""
        rec = next(r for r in self.run.records[rank] if r.tag == tag and r.step == step and not r.is_p2p)
        return rec.seq + seq_offset(rec.group.desc)

    def write(self, folder: Path) -> Path:
        """One file per rank, dated when it was pulled."""
        folder.mkdir(parents=True, exist_ok=True)
        for rank, data in self.dumps().items():
            path = folder / self.source(rank)
            path.write_bytes(data)
            when = ns(self.dump_at[rank])
            os.utime(path, ns=(when, when))
        return folder


def records_per_step(layout: Layout, timing: Timing) -> int:
    """The fewest recorder entries any rank makes per step."""
    def count(ins: Instr) -> int:
        if isinstance(ins, Coll):
            return len(ins.calls) + ins.coalesced
        ops = getattr(ins, "ops", None)
        return len(ops) if ops is not None else 0
    return min(sum(map(count, program(layout, r, timing))) for r in range(layout.world))


def steps_for(layout: Layout, timing: Timing, capacity: int, at_least: int = 3) -> int:
    """Steps to simulate so that every ring holds ``capacity`` entries (it wraps)."""
    return max(at_least, math.ceil(capacity / records_per_step(layout, timing)) + 1)


def pull(ranks: range | list[int], at: float, *, spread_s: float = 0.02, seed: int = 0) -> dict[int, float]:
    """Dumps pulled one rank after another from ``at`` on, within ``spread_s``."""
    rng = random.Random(seed)
    return {r: at + rng.uniform(0, spread_s) for r in ranks}


_RUNS: dict[tuple, Run] = {}


def job(layout: Layout, timing: Timing, capacity: int, faults: Faults | None = None, *,
        fault_step: int | None = None, seed: int = 0, key: tuple | None = None) -> Run:
    """Enough steps for the ring to wrap (and up to the fault's step). With ``key`` (what makes
    the run, faults included), a run is simulated once and shared: runs are never modified."""
    steps = steps_for(layout, timing, capacity)
    if fault_step is not None:
        steps = max(steps, fault_step + 1)
    if key is None:
        return simulate(layout, steps, timing, faults, seed=seed)
    key = (key, layout.tp, layout.pp, layout.dp, layout.vpp, timing, steps, seed)
    if key not in _RUNS:
        _RUNS[key] = simulate(layout, steps, timing, faults, seed=seed)
    return _RUNS[key]


def target(step: int, tag: str, nth: int = 0) -> Target:
    return Target(step, tag, nth)
