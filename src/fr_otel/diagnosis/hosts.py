"""Ranks as hosts: which host was lost, which is cut off, and when each went silent.

Users ask first *which node* hung. A node that is cut off, frozen or crashed leaves no dump, so
its ranks are known only from the host map written before anything went wrong, and its silence
only from the heartbeats it stopped sending. From inside one node a lost peer and a lost self look
alike (every peer goes silent): the network facts the analysing node recorded tell them apart
(:mod:`fr_otel.read.network`): whether the job's store still answered, and which hosts' agents
accepted a connection.

Three calls, in this order:

- **cut off, every node's view**: the folders of several nodes read together hold each node's view; the
  host that none of the others reached, while they reach each other, is the one cut off, whether or not
  its own dumps are among them;
- **cut off**: the analysing node reached none of the other hosts it tried (every one of them
  probed: a host it could not probe, for want of an address, is no evidence), and every other
  host's ranks are missing: it is the one cut off (its own ranks are the culprits; the others are
  "unreachable from here", not culprits);
- **store host lost**: the job's store stopped answering here while another host still answers, and
  the store's host's agents refused a connection at their address (or its ranks went silent before the
  others): the store's host is the suspect, and ranks on hosts that answer are alive elsewhere (reported,
  not blamed). Timeouts alone are no evidence: a loaded store answers late;
- **lost host**: every rank of a host is missing and the host went silent (no heartbeat for a few
  polls, or its agent answered nothing): a lost node, named as one.

Pure data in, pure data out: the analysis turns the call into culprits and evidence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..common.clock import format_clock
from ..common.ranks import compress_ranks
from .job import Job

__all__ = ["LOST_STATES", "SILENT_S", "HostFinding", "NetworkCall", "cut_off_by_all", "host_findings",
           "judge_network", "last_step", "merged_answers", "silent_before_s"]

#: The host states that answer "which node": each with the words a headline says it in.
LOST_STATES = {"cut_off": "cut off", "store_lost": "lost (it runs the job's store)", "lost": "lost"}

#: A rank last heard from this long before the last rank heard from counts as silent.
SILENT_S = 3.0


@dataclass(frozen=True, slots=True)
class HostFinding:
    """One host of the job as the verdict sees it."""

    host: str
    ranks: tuple[int, ...]  # the job's ranks on it (the host map)
    missing: tuple[int, ...]  # of them, the ones with no dump
    blamed: tuple[int, ...]  # of them, the ones named as culprits
    state: str  # "lost" | "cut_off" | "store_lost" | "culprit" | "unreachable" | "unknown"
    last_heard_ns: int | None = None  # the latest heartbeat of its missing ranks
    silent_before_s: float | None = None  # how long before the others stalled it went silent
    answered: bool | None = None  # did its agent answer the analysing node (None: not tried)
    store: bool = False  # it runs the job's store
    last_step: int | None = None  # the training step of that latest heartbeat (None: not counted)
    #: The step its group was in when it went silent: the step of the collective its peers wait in.
    group_step: int | None = None
    probed: str | None = None  # the ``address:port`` its agent was probed at (None: not probed)

    def sentence(self) -> str:
        """``node1 (ranks 2-3): no dump; last heard 13:01:02.5 UTC at step 12, 0.4 s before the others stalled``."""
        who = f"{self.host} ({_ranks_word(self.ranks)})"
        what = {"lost": "no dump", "cut_off": "cut off from every other host",
                "store_lost": "no dump; it runs the job's store, which stopped answering",
                "culprit": "culprit", "unknown": "no dump here; alive elsewhere",
                "unreachable": "unreachable from here"}.get(self.state, self.state)
        if self.state in ("lost", "store_lost") and len(self.missing) < len(self.ranks):
            what = f"no dump from {_ranks_word(self.missing)}"
        text = f"{who}: {what}"
        if self.group_step is not None and self.missing:
            text += f"; in step {self.group_step} when it went silent (the step its peers wait in)"
        if self.last_heard_ns:
            text += f"; last heard {format_clock(self.last_heard_ns)}"
            if self.last_step is not None:
                text += f" at step {self.last_step}"
            if self.silent_before_s is not None:
                when = "before" if self.silent_before_s >= 0 else "after"
                text += f", {abs(self.silent_before_s):.1f} s {when} the others stalled"
        if self.answered is False:
            text += f"; its agent{f' at {self.probed}' if self.probed else ''} does not answer"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "ranks": list(self.ranks), "missing": list(self.missing),
                "blamed": list(self.blamed), "state": self.state, "last_heard_ns": self.last_heard_ns,
                "last_step": self.last_step, "group_step": self.group_step, "probed": self.probed,
                "silent_before_stall_s": self.silent_before_s, "answered": self.answered, "store": self.store,
                "sentence": self.sentence()}


@dataclass(frozen=True, slots=True)
class NetworkCall:
    """What the network facts and the host map say about the missing ranks."""

    cut_off: str | None = None  # the analysing node, cut off from every other host
    store_lost: str | None = None  # the store's host, lost (the store stopped answering here)
    lost: tuple[str, ...] = ()  # hosts lost: every rank missing, and silent
    alive_elsewhere: frozenset[int] = frozenset()  # missing ranks on hosts that answered: not to blame
    why: dict[str, str] = field(default_factory=dict)  # host -> one sentence of evidence

    @property
    def explains(self) -> bool:
        """The network says who: the verdict need not wait for the dumps it cannot have."""
        return bool(self.cut_off or self.store_lost or self.lost)


def _ranks_word(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {compress_ranks(ranks)}"


def _by_host(job: Job) -> dict[str, tuple[int, ...]]:
    out: dict[str, list[int]] = {}
    for rank, p in job.processes.items():
        if p.host and (job.world_size is None or rank < job.world_size):
            out.setdefault(p.host, []).append(rank)
    return {h: tuple(sorted(r)) for h, r in out.items()}


def silent_before_s(job: Job, ranks: Iterable[int], stall_ns: int | None) -> tuple[int | None, float | None]:
    """The latest heartbeat of ``ranks``, and how long before ``stall_ns`` that was (None: unknown)."""
    heard = [job.last_heard[r] for r in ranks if r in job.last_heard]
    last = max(heard) if heard else None
    return last, ((stall_ns - last) / 1e9 if last is not None and stall_ns else None)


def last_step(job: Job, ranks: Iterable[int]) -> int | None:
    """The training step of the latest heartbeat of ``ranks`` (None: not counted, or never heard)."""
    heard = [(job.last_heard[r], r) for r in ranks if r in job.last_heard]
    return job.last_step.get(max(heard)[1]) if heard else None


def _silent(job: Job, ranks: Iterable[int]) -> bool:
    """Every one of ``ranks`` stopped its heartbeat a while before the others' last (or never beat);
    the comparison is between heartbeats, so no clock but the store's polls is involved."""
    if not job.last_heard:
        return False
    limit = max(job.last_heard.values()) - int(SILENT_S * 1e9)
    return all(job.last_heard.get(r, 0) < limit for r in ranks)


def judge_network(job: Job) -> NetworkCall:
    """Cut off, store host lost, or lost hosts: what the host map, heartbeats and probes say."""
    hosts = _by_host(job)
    missing = set(job.missing_ranks)
    alone = cut_off_by_all(job) if hosts else None
    if not hosts or not (missing or alone):
        return NetworkCall()
    net = job.network
    gone = {h: r for h, r in hosts.items() if r and set(r) <= missing}  # every rank of it without a dump
    answered = merged_answers(job) if len(job.network_views) > 1 else (net.answered if net is not None else {})
    if alone is not None and alone in hosts and alone not in gone:
        return NetworkCall(cut_off=alone, alive_elsewhere=frozenset(
            rank for h, ranks in hosts.items() if answered.get(h) for rank in ranks if rank in missing), why={
            alone: f"none of the other hosts reached {alone} ({', '.join(_tried_by(job, alone)[:6])} did not), "
                   f"while they reach each other: {alone} is the one cut off"})
    if net is not None and net.seen_from in hosts:
        here = net.seen_from
        others = [h for h in hosts if h != here]
        tried = [h for h in others if h in answered]
        unprobed = [h for h in others if h in net.not_probed]  # no evidence either way: never "cut off"
        if (others and tried and not unprobed and not any(answered[h] for h in tried)
                and set(gone) >= set(others)):
            return NetworkCall(cut_off=here, why={here: (
                f"{here} reached none of the other hosts ({', '.join(sorted(tried)[:6])} did not answer) and every "
                f"rank elsewhere went silent: {here} is the one cut off"
                + (f"; the job's store at {net.store_address} stopped answering it too" if net.store_lost else ""))})
    store_host = job.store_host or (net.store_host if net is not None else None)
    alive = frozenset(rank for h, ranks in hosts.items() if answered.get(h) for rank in ranks if rank in missing)
    lost = tuple(sorted(h for h, r in gone.items()
                        if (answered.get(h) is False or _silent(job, r)) and h != store_host))
    why = {h: f"every rank of {h} ({_ranks_word(gone[h])}) left no dump and went silent" for h in lost}
    # A store that stops answering here is no lost host by itself (a loaded store answers slowly, and the calls
    # time out): its host is the suspect only when its agents refused a connection at their address too, or its
    # ranks went silent before the others.
    against_store_host = store_host in gone and (answered.get(store_host) is False or _silent(job, gone[store_host])) \
        if store_host else False
    if (net is not None and net.store_lost and store_host and against_store_host
            and store_host != net.seen_from):
        since = f" since {format_clock(net.store_silent_since_ns)}" if net.store_silent_since_ns else ""
        others_up = sorted(h for h, ok in answered.items() if ok)
        # Another host silent too (its agent does not answer, or its heartbeats stopped): lost as well, named
        # as such (a crash there can take the store's host down with it: each says what it is).
        return NetworkCall(store_lost=store_host, lost=lost, alive_elsewhere=alive, why={**why, store_host: (
            f"the job's store at {net.store_address or store_host} ({store_host}) has not answered {net.seen_from}"
            f"{since}" + (f", while {', '.join(others_up[:6])} still answer" if others_up else "")
            + f": {store_host} is the suspect")})
    if store_host in gone and (answered.get(store_host) is False or _silent(job, gone[store_host])):
        lost = tuple(sorted((*lost, store_host)))
        why[store_host] = f"every rank of {store_host} ({_ranks_word(gone[store_host])}) left no dump and went silent"
    return NetworkCall(lost=lost, alive_elsewhere=alive, why=why)


def merged_answers(job: Job) -> dict[str, bool]:
    """Host -> did any other node's agent reach it (every node's view, read together; only hosts probed)."""
    out: dict[str, bool] = {}
    for view in job.network_views:
        for host, ok in view.answered.items():
            if host != view.seen_from:
                out[host] = out.get(host, False) or ok
    return out


def _tried_by(job: Job, host: str) -> list[str]:
    return sorted({v.seen_from for v in job.network_views if host in v.answered and v.seen_from != host})


def cut_off_by_all(job: Job) -> str | None:
    """The one host no other node reached, by the nodes that reached someone (several nodes' views), or None.

    A node that reached no one witnesses nothing (it may be the one cut off); the host's own view, when
    among them, must agree (it reached none of the others it tried)."""
    views = {v.seen_from: v for v in job.network_views}
    if len(views) < 2:
        return None
    witnesses = [v for v in views.values() if any(ok for h, ok in v.answered.items() if h != v.seen_from)]
    probed = {h for v in witnesses for h in v.answered if h != v.seen_from}
    unreached = sorted(h for h in probed if not any(v.answered.get(h) for v in witnesses if v.seen_from != h))
    if len(unreached) != 1:
        return None
    (host,) = unreached
    own = views.get(host)
    if own is not None and any(ok for h, ok in own.answered.items() if h != host):
        return None
    return host


def host_findings(job: Job, blamed: Mapping[int, str], call: NetworkCall, stall_ns: int | None,
                  group_step: Mapping[str, int | None] | None = None) -> list[HostFinding]:
    """Every host with a missing rank or a culprit, lost ones first in the order they went silent;
    ``group_step``: per host, the step of the collective its peers wait in (its ranks' culprits')."""
    hosts = _by_host(job)
    missing = set(job.missing_ranks)
    answered = (merged_answers(job) if len(job.network_views) > 1
                else job.network.answered if job.network is not None else {})
    probed = job.network.probed if job.network is not None else {}
    store_host = job.store_host or (job.network.store_host if job.network is not None else None)
    out: list[HostFinding] = []
    for host, ranks in hosts.items():
        gone = tuple(r for r in ranks if r in missing)
        named = tuple(r for r in ranks if r in blamed)
        if not gone and not named:
            continue
        if host == call.cut_off:
            state = "cut_off"
        elif host == call.store_lost:
            state = "store_lost"
        elif host in call.lost:
            state = "lost"
        elif named:
            state = "culprit"
        elif call.cut_off is not None:
            state = "unreachable"
        else:
            state = "unknown"
        last, before = silent_before_s(job, gone, stall_ns) if gone else (None, None)
        out.append(HostFinding(host, ranks, gone, named, state, last, before, answered.get(host), host == store_host,
                               last_step(job, gone) if gone else None, (group_step or {}).get(host),
                               probed.get(host)))
    order = {"cut_off": 0, "store_lost": 1, "lost": 2, "culprit": 3, "unreachable": 4, "unknown": 5}
    out.sort(key=lambda f: (order[f.state], f.last_heard_ns or 1 << 62, f.host))
    return out
