"""What to do next, per culprit kind: the runbook step the report puts on every card.

Kept apart from the page's layout because it is the product's operational knowledge (which
command on which host, what to look for), reviewed by different people than the markup.
Returns escaped HTML: commands in ``<code>``, dump text through :func:`esc`.
"""

from __future__ import annotations

from ..common.commands import py_spy_command_line
from ..common.ranks import compress_ranks
from ..diagnosis.verdict import Culprit
from ..read.dump import op_name
from .facts import Facts
from .markup import esc, seq_label

__all__ = ["general_next_step", "next_step"]


def _py_spy(c: Culprit, what: str = "dump") -> str:
    """The py-spy command for this culprit, with its real host and pid when known (shell-quoted:
    people paste it)."""
    p = c.process
    host = p.host if p is not None and p.host else c.host
    cmd = py_spy_command_line(what, p.pid if p is not None else None, host)
    return f"<code>{esc(cmd, 400)}</code>"


def next_step(f: Facts, c: Culprit) -> str:
    """The next step for culprit ``c``: where to look, with its real host and pid when known."""
    r = c.rank
    op = esc(op_name(c.op or "the collective"), 80)
    seq = seq_label(c.collective_seq_id)
    nccl = "nccl" in f.verdict.backends
    if c.kind == "not_enqueued":
        return (f"Rank {r} never reached {op} {seq}: its Python was somewhere else. Find out where: "
                f"{_py_spy(c)} (add <code>--native</code> for C++ frames) on rank {r}'s "
                "process while it is still alive, its stacks below, and its log (a stuck data loader, "
                "checkpoint or file I/O, an exception in a different code path, a held GIL, a "
                "rank-dependent branch that skips the collective).")
    if c.kind == "not_completed":
        if nccl:
            return (f"Rank {r} entered {op} {seq} but its GPU or network never finished it while its peers did. "
                    "Check that host's GPU and NIC: <code>dmesg | grep -i xid</code> and DCGM health "
                    "(<code>dcgmi health -c</code>) for XID / ECC errors, <code>nvidia-smi -q</code>, the NIC's link "
                    "state and error counters (<code>ibstat</code>, <code>ethtool -S</code>), and the NCCL log "
                    "(<code>NCCL_DEBUG=INFO</code>) around the reference time.")
        return (f"Rank {r} entered {op} {seq} but never finished it while its peers did. Check that host's network "
                "(TCP connectivity to its peers, <code>ss -tnp</code>, interface errors) and whether the process "
                f"is starved of CPU; {_py_spy(c)} shows where rank {r} is blocked.")
    if c.kind == "mismatch":
        return (f"Rank {r} called a different collective than its peers at {seq}. Compare the two call sites "
                "(below, under Stacks): typically a rank-dependent branch, a conditional collective, or tensors "
                "whose shapes or dtypes differ across ranks. Fix the code so every rank issues the same sequence "
                "of collectives on this group.")
    if c.kind == "missing_dump":
        return (f"There is no dump from rank {r}. Find out whether its process was alive at dump time "
                "(OOM killer, crash, lost node: the scheduler's and the node's logs, <code>dmesg</code>), and make "
                "sure every rank can dump (<code>TORCH_NCCL_DUMP_ON_TIMEOUT=1</code>, a writable "
                "<code>TORCH_FR_DUMP_TEMP_FILE</code> location).")
    if c.kind == "unknown":
        cause = f"rank {compress_ranks(c.waits_on)}" if c.waits_on else "the culprits above"
        return (f"Rank {r} left no readable dump, but its peers show it kept pace until {esc(cause)} stopped: it most "
                f"likely waits on {esc(cause)}, so start there. Then find out why rank {r}'s dump is missing or cut "
                "short (killed while writing, disk full: the node's logs, <code>dmesg</code>).")
    if c.kind == "straggler":
        return (f"Nothing hangs, but rank {r} is consistently the last to enqueue. Profile it "
                f"({_py_spy(c, 'top')}, the torch profiler): data loading, CPU contention, thermal "
                "throttling or a slower host. A constant offset can also be clock skew between hosts: compare "
                "their clocks before blaming the rank.")
    return "Look at this rank's process and host around the reference time."


def general_next_step(f: Facts) -> str:
    """The next step when no rank is to blame (inconclusive, healthy)."""
    v = f.verdict
    if v.verdict == "inconclusive":
        return ("Read the notes below. When every member entered a collective and none completed it, the fault "
                "is inside the collective (device or network): check every host of that group "
                "(<code>dmesg | grep -i xid</code>, DCGM health, NIC link errors, <code>NCCL_DEBUG=INFO</code> logs). "
                "Otherwise, dump every rank again (with stack traces) while the job is stuck.")
    if v.verdict == "healthy":
        return ("Nothing is stuck in the recorded collectives. If the job still hangs, it hangs outside them "
                "(point-to-point ops under gloo, a data loader, I/O): <code>py-spy dump</code> every rank.")
    return "See the notes below."

