"""Where each rank sits in a 3D-parallel job, and the process groups that follow from it.

Ranks are numbered tensor-parallel fastest, then data-parallel, then pipeline stage (the
usual "tp-dp-pp" order), so one host of ``gpus_per_node`` consecutive ranks holds whole
tensor-parallel groups. Every rank creates every group in the same order, so a group's name
(its creation counter) is the same on every rank, while its local slot (``pg_id``) is the
rank's own count of the groups it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Group", "Layout"]

WORLD = "default_pg"
TP = "TENSOR_MODEL_PARALLEL_GROUP"
DP = "DATA_PARALLEL_GROUP"
PP = "PIPELINE_MODEL_PARALLEL_GROUP"
MP = "MODEL_PARALLEL_GROUP"
EMB = "EMBEDDING_GROUP"


@dataclass(frozen=True, slots=True)
class Group:
    """One process group: its name (creation counter), kind (desc) and members in local order."""

    name: str
    desc: str
    ranks: tuple[int, ...]

    def local(self, rank: int) -> int:
        return self.ranks.index(rank)


@dataclass(slots=True)
class Layout:
    """TP x PP x DP ranks with ``vpp`` virtual pipeline chunks per stage."""

    tp: int
    pp: int
    dp: int
    vpp: int = 1
    gpus_per_node: int = 8
    groups: list[Group] = field(default_factory=list)
    of: dict[tuple[int, str], Group] = field(default_factory=dict)  # (rank, desc) -> its group

    def __post_init__(self) -> None:
        self.groups = []
        self._add(WORLD, [list(range(self.world))])
        self._add(DP, [[self.rank(t, d, p) for d in range(self.dp)] for p in range(self.pp) for t in range(self.tp)])
        self._add(TP, [[self.rank(t, d, p) for t in range(self.tp)] for p in range(self.pp) for d in range(self.dp)])
        if self.pp > 1:
            self._add(PP, [[self.rank(t, d, p) for p in range(self.pp)] for d in range(self.dp) for t in range(self.tp)])
        self._add(MP, [sorted(self.rank(t, d, p) for p in range(self.pp) for t in range(self.tp))
                       for d in range(self.dp)])
        if self.pp > 1:
            self._add(EMB, [[self.rank(t, d, 0), self.rank(t, d, self.pp - 1)]
                            for d in range(self.dp) for t in range(self.tp)])

    def _add(self, desc: str, member_lists: list[list[int]]) -> None:
        for members in member_lists:
            g = Group(str(len(self.groups)), desc, tuple(members))
            self.groups.append(g)
            for r in members:
                self.of[(r, desc)] = g

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def rank(self, t: int, d: int, p: int) -> int:
        return t + self.tp * (d + self.dp * p)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp rank, dp rank, stage)."""
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def stage(self, rank: int) -> int:
        return self.coords(rank)[2]

    def node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def node_ranks(self, node: int) -> tuple[int, ...]:
        return tuple(r for r in range(self.world) if self.node(r) == node)

    def group(self, rank: int, desc: str) -> Group | None:
        return self.of.get((rank, desc))

    def member_of(self, rank: int) -> list[Group]:
        """The rank's groups in creation order (its local slots)."""
        return [g for g in self.groups if rank in g.ranks]

    def stage_rank(self, rank: int, stage: int) -> int:
        """The rank holding the same tp/dp position on ``stage``."""
        t, d, _ = self.coords(rank)
        return self.rank(t, d, stage)
