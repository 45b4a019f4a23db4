"""The real-hang scenarios: each one's plan (who misbehaves, where) and every rank's moves, side by side.

A scenario is one class: ``plan`` says what the job will show (written to ``scenario.json``),
``run`` is what each rank does, ending in its dump. Add a scenario by writing its class and
listing it in ``SCENARIOS``. Collectives are called here, in this file, so a pickled dump's
innermost job frame (the call site a report shows) is a line of the scenario that made it.
"""

from __future__ import annotations

import time

from .rank import STALL_S, Plan, RankRun, Scenario, first_line

__all__ = ["SCENARIOS"]

FALLBACK_DUMP_S = 8.0  # shape_mismatch normally completes; dump anyway if gloo hangs on it


class SkipAllreduce(Scenario):
    name = "skip_allreduce"

    def plan(self, world_size: int) -> Plan:
        c = min(2, world_size - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 6,
                "description": f"5 world all_reduces; rank {c} skips the 6th (sleeps), the others block in it"}

    def run(self, rank: RankRun, plan: Plan) -> None:
        import torch.distributed as dist

        def all_reduce_gradients() -> None:  # the demo's call site: named as a training loop would name it
            dist.all_reduce(rank.tensor())

        for _ in range(5):
            rank.done(all_reduce_gradients)
        if rank.rank == plan["misbehaving_rank"]:
            rank.stall("skipped the 6th world all_reduce (sleeping)")
        rank.blocked_in("blocked in the 6th world all_reduce", all_reduce_gradients)


class SubgroupStall(Scenario):
    name = "subgroup_stall"
    min_world_size = 4

    def plan(self, world_size: int) -> Plan:
        a, b = list(range(world_size // 2)), list(range(world_size // 2, world_size))
        return {"misbehaving_rank": b[-1], "group": "B", "step": 4, "subgroups": {"A": a, "B": b},
                "description": f"3 world + 3 own-subgroup all_reduces; rank {b[-1]} stalls before its 4th "
                               f"all_reduce on B={b}; B's other ranks block in it; A={a} completes its 4th "
                               "all_reduce, then blocks in the 4th world all_reduce"}

    def run(self, rank: RankRun, plan: Plan) -> None:
        import torch.distributed as dist

        mine, my_label = None, ""
        for label, members in plan["subgroups"].items():  # all ranks, same order
            pg = dist.new_group(members, group_desc=f"subgroup_{label}")
            if rank.rank in members:
                mine, my_label = pg, label
                rank.add_group(pg, members, label)
        for _ in range(3):
            rank.done(lambda: dist.all_reduce(rank.tensor()))
        for _ in range(3):
            rank.done(lambda: dist.all_reduce(rank.tensor(), group=mine))
        if rank.rank == plan["misbehaving_rank"]:
            rank.stall(f"stalled before its 4th all_reduce on {my_label} (sleeping)")
        if my_label == "B":
            rank.blocked_in("blocked in the 4th all_reduce on B", lambda: dist.all_reduce(rank.tensor(), group=mine))
        rank.done(lambda: dist.all_reduce(rank.tensor(), group=mine))
        rank.blocked_in("completed the 4th all_reduce on A; blocked in the 4th world all_reduce",
                        lambda: dist.all_reduce(rank.tensor()))


class OpMismatch(Scenario):
    name = "op_mismatch"

    def plan(self, world_size: int) -> Plan:
        c = min(1, world_size - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 4,
                "description": f"3 world all_reduces; at the 4th, rank {c} calls broadcast (src 0) "
                               "where the others call all_reduce"}

    def run(self, rank: RankRun, plan: Plan) -> None:
        import torch.distributed as dist

        for _ in range(3):
            rank.done(lambda: dist.all_reduce(rank.tensor()))
        if rank.rank == plan["misbehaving_rank"]:
            rank.blocked_in("called broadcast (src 0) as the 4th world collective",
                            lambda: dist.broadcast(rank.tensor(), src=0))
        rank.blocked_in("called all_reduce as the 4th world collective", lambda: dist.all_reduce(rank.tensor()))


class ShapeMismatch(Scenario):
    name = "shape_mismatch"

    def plan(self, world_size: int) -> Plan:
        c = min(3, world_size - 1)
        return {"misbehaving_rank": c, "group": "world", "step": 4,
                "description": f"3 world all_reduces of (4, 4); at the 4th rank {c} passes (2, 8) "
                               "(same numel) where the others pass (4, 4)"}

    def run(self, rank: RankRun, plan: Plan) -> None:
        import torch
        import torch.distributed as dist

        for _ in range(3):
            rank.done(lambda: dist.all_reduce(rank.tensor()))
        shape = (2, 8) if rank.rank == plan["misbehaving_rank"] else (4, 4)
        rank.outcome = f"4th world all_reduce with shape {shape}"
        rank.arm(FALLBACK_DUMP_S)  # only if gloo hangs on it; normally it completes
        try:
            dist.all_reduce(torch.ones(shape))
            rank.outcome += "; completed"
        except Exception as e:  # noqa: BLE001 - recorded; the fallback timer dumps
            rank.outcome += f"; raised {type(e).__name__}: {first_line(e)}"
            time.sleep(STALL_S)
        rank.dump_and_exit(settle_first=True)


class Healthy(Scenario):
    name = "healthy"
    straggle_s = 0.0  # how long the misbehaving rank sleeps before each all_reduce

    def plan(self, world_size: int) -> Plan:
        return {"misbehaving_rank": None, "group": "world", "step": None,
                "description": "12 world all_reduces, all completed"}

    def run(self, rank: RankRun, plan: Plan) -> None:
        import torch.distributed as dist

        for _ in range(12):
            if self.straggle_s and rank.rank == plan["misbehaving_rank"]:
                time.sleep(self.straggle_s)
            rank.done(lambda: dist.all_reduce(rank.tensor()))
        rank.outcome = "completed all collectives"
        rank.dump_and_exit(settle_first=True)


class Straggler(Healthy):
    name = "straggler"
    straggle_s = 0.25

    def plan(self, world_size: int) -> Plan:
        c = min(1, world_size - 1)
        return {"misbehaving_rank": c, "group": "world", "step": None,
                "description": f"12 world all_reduces; rank {c} sleeps {self.straggle_s} s before each; no hang"}


#: Every scenario by name, in the order the docs list them.
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    SkipAllreduce(), SubgroupStall(), OpMismatch(), ShapeMismatch(), Straggler(), Healthy())}
