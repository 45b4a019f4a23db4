"""Incidents agreed through the job's own store: who raised it, who takes part, what they sent.

No new service: the agent talks to the TCPStore torch.distributed already runs. It opens
its **own client connection** to that server (same host and port as the default store),
so its calls never queue behind the training thread's store calls (a TCPStore client
serialises its operations on one mutex) and its timeout is its own. Where the store is
not a TCPStore it falls back to the default store itself. Either way it only uses calls
that answer at once: ``check``, ``add``, ``compare_set``, ``set``, and ``get`` of keys
known to exist; never a blocking ``get``/``wait`` on a key that may never come.

Keys, under ``fr_otel/<hash of the job identity>/``::

    i/<k>/by/<rank>     set by a raiser just before its claim: no owner key is joined without it
    i/<k>/owner         compare_set claim of incident k: JSON {rank, reason, ...} of the raiser
    i/<k>/dump/<rank>   that rank's recorder for incident k (see :mod:`..observe.payload`)
    i/<k>/arrived       add() counter of ranks that sent theirs
    i/<k>/result        JSON verdict summary, set by the coordinator (the raiser)
    i/<k>/files         the files the coordinator left beside its dumps (zlib'd JSON), for every node
    final/<rank>        a rank's recorder at its exit, for later incidents' coordinators
    host/<rank>         JSON {host, node, pid, local_rank}: where the rank runs, set once at start-up
    hb/<rank>           the wall clock (ns) of the rank's last poll, and its training step then ("<ns> <step>")
    term/count          add() counter of ranks that received SIGTERM
    term/<rank>         the incident (number) that rank was part of when SIGTERM came, "0" if none
    w/<rank>            JSON: the rank's recent waits per group, every few seconds (see :mod:`..slow_watch`)
    nodes               add() counter of node leaders; each takes the next number n once
    nclaim/<n>          the leader that took number n (compare_set): a counter forged past the world size
                        sends later leaders to the free numbers below it, from the top
    nhb/<n>             node n's heartbeat, from its leader: JSON {host, leader, t, ranks: {rank: last heard},
                        steps: {rank: its training step then}}
    i/<k>/nodes         add() counter of node summaries sent for incident k
    i/<k>/node/<j>      the j-th node summary (see :mod:`fr_otel.read.node_summary`)
    i/<k>/need          the ranks (as runs) whose whole recorders the coordinator asks their leaders for

With node leaders (:mod:`.node_leader`) only one agent per node polls: the store serves one
request per node per poll interval, and one summary per node at an incident.

Incident numbers start at 1; an agent learns of incident k by ``check``-ing its owner key
on each poll (one round trip per second per rank, like the NCCL watchdog's own polling).
The trace id of incident k is ``trace_id_for(job_id, str(k))``: every rank computes it.

The store has no authentication: anything that reaches its port can write these keys. So every count
read from it is bounded by the world size (a job of W ranks has at most W nodes and W node summaries
per incident), a node heartbeat naming more than :data:`MAX_RANKS_PER_NODE` ranks is dropped, and each
kind of forgery is said once (:mod:`.store_trust`), never once per key.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

from ...common.log import logger
from ...incident.trigger import Trigger
from .signing import Seal, job_secret
from .store_link import STORE_TIMEOUT_S, LinkedStore, StoreLink
from .store_trust import Forgeries

__all__ = ["MAX_RANKS_PER_NODE", "IncidentChannel", "beat_text", "connect_channel", "job_digest", "parse_beat"]

_FETCH_BATCH = 256  # payloads per multi_get (~5 MB at ~20 KB each)
#: A node heartbeat carries at most this many ranks (no real node runs more processes); one naming more is dropped.
MAX_RANKS_PER_NODE = 1024

log = logger("fr_otel.agent")


def beat_text(now_ns: int, step: int | None) -> str:
    """A heartbeat's text: ``"<wall clock ns>"``, or ``"<ns> <step>"`` once the rank counts steps."""
    return str(now_ns) if step is None else f"{now_ns} {step}"


def parse_beat(text: str) -> tuple[int, int | None] | None:
    """``(ns, step)`` from :func:`beat_text`'s text (step None when absent); None when it is not one."""
    parts = text.strip().split(" ")
    if not 1 <= len(parts) <= 2 or not all(p.isascii() and p.isdigit() and len(p) < 20 for p in parts):
        return None
    return int(parts[0]), (int(parts[1]) if len(parts) == 2 else None)


class IncidentChannel:
    """The incident protocol over one store (a PrefixStore over the job's TCPStore)."""

    def __init__(self, store: Any, how: str, link: StoreLink | None = None, address: str = "",
                 seal: Seal | None = None) -> None:
        self.link = link if link is not None else StoreLink()
        #: Signs every value written and verifies every value read (:mod:`.signing`); None: unauthenticated.
        self.seal = seal
        self.store = LinkedStore(store, self.link)
        self.how = how  # "own connection to host:port" or "default store"
        self.address = address  # the job's store as host:port ("" when it is not a TCPStore)
        #: The heartbeats last read (rank -> wall ns): what an incident still knows once the store is gone.
        self.heard: dict[int, int] = {}
        self.steps: dict[int, int] = {}  # each rank's training step at the last heartbeat read
        self._listed_waits: set[int] = set()  # ranks this channel put on the w/who list
        #: Says each kind of forgery found in the store once: ``forged(kind, detail)``.
        self.forged = Forgeries()

    def _sealed(self, key: str, value: str | bytes) -> bytes:
        """``value`` as written under ``key``: signed where the job has a secret."""
        raw = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)
        return raw if self.seal is None else self.seal.sign(key, raw)

    def _put(self, key: str, value: str | bytes) -> None:
        self.store.set(key, self._sealed(key, value))

    def _opened(self, key: str, raw: Any) -> bytes | None:
        """What was read under ``key``, verified; None (said once per kind of key) when it is not signed by
        this job: it is then as if absent (never joined, concluded or counted)."""
        blob = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else bytes(raw)
        if self.seal is None:
            return blob
        value = self.seal.open(key, blob)
        if value is None:
            self.forged(f"{_key_kind(key)} record without this job's signature",
                        f"{key} does not verify under the job's secret")
        return value

    def _get(self, key: str) -> bytes | None:
        """The verified value of ``key``; None while absent or when it does not verify."""
        return self._opened(key, self.store.get(key)) if self.store.check([key]) else None

    def _count(self, key: str, bound: int, kind: str) -> int:
        """The ``add`` counter ``key``, read as at most ``bound`` (the job's shape allows no more)."""
        n = int(self.store.add(key, 0))
        if not 0 <= n <= bound:
            self.forged(kind, f"{key} reads {n}, the job has {bound} ranks; read as {max(0, min(n, bound))}")
        return max(0, min(n, bound))

    def reachable(self) -> bool:
        """False while the store does not answer or the link backs off (skip the poll's store calls)."""
        return self.link.reachable()

    # -- incidents ----------------------------------------------------------------------
    def claim(self, trigger: Trigger) -> tuple[bool, dict[str, Any]]:
        """Try to raise incident ``trigger.number``; returns (we raised it, the raiser's owner record). The
        raiser's mark goes first (``i/<k>/by/<rank>``: a token its claim also carries): an owner key that no
        mark matches was not written by a raiser of this job (:meth:`raised_by`)."""
        k, token = trigger.number, uuid.uuid4().hex
        self._put(f"i/{k}/by/{trigger.raised_by}", token)
        mine = self._sealed(_owner(k), json.dumps({**trigger.to_record(), "claim": token}, sort_keys=True))
        got = _bytes(self.store.compare_set(_owner(k), "", mine))
        if got == mine:
            return True, _json(_text(self._opened(_owner(k), got) or b""))
        opened = self._opened(_owner(k), got)
        return False, (_json(_text(opened)) if opened is not None else {})

    def owner(self, k: int) -> dict[str, Any] | None:
        """The owner record of incident ``k`` (:meth:`~fr_otel.incident.trigger.Trigger.from_record` reads it),
        or None while nobody raised it."""
        key = _owner(k)
        if not self.store.check([key]):
            return None
        value = self._opened(key, self.store.get(key))
        return _json(_text(value)) if value is not None else {}

    def raised_by(self, trigger: Trigger) -> bool:
        """The rank an incident's owner record names marked itself, with that record's token, before claiming
        it (see :meth:`claim`)."""
        key = f"i/{trigger.number}/by/{trigger.raised_by}"
        mark = self._get(key) if trigger.claim else None
        return mark is not None and _text(mark) == trigger.claim

    def publish(self, k: int, rank: int, payload: bytes) -> None:
        self._put(f"i/{k}/dump/{rank}", payload)
        self.store.add(f"i/{k}/arrived", 1)

    def arrived(self, k: int) -> int:
        return int(self.store.add(f"i/{k}/arrived", 0))

    def fetch(self, k: int, ranks: list[int]) -> dict[int, bytes]:
        """The payloads of ``ranks`` that are there (absent ones are skipped, not waited for)."""
        return self._fetch([(r, f"i/{k}/dump/{r}") for r in ranks])

    def set_result(self, k: int, result: dict[str, Any]) -> None:
        self._put(f"i/{k}/result", json.dumps(result, sort_keys=True))

    def result(self, k: int) -> dict[str, Any] | None:
        value = self._get(f"i/{k}/result")
        return _json(_text(value)) if value is not None else None

    def concluded(self, k: int) -> bool:
        """The coordinator has published incident ``k``'s verdict (what it gathers is no longer read): a result
        this job signed (a planted one concludes nothing)."""
        key = f"i/{k}/result"
        return bool(self.store.check([key])) and (self.seal is None or self._get(key) is not None)

    def cleanup(self, k: int, ranks: list[int], summaries: int = 0) -> None:
        """Free the store of incident ``k``'s payloads (``ranks``') and its first ``summaries`` node summaries."""
        for r in ranks:
            self.store.delete_key(f"i/{k}/dump/{r}")
        for j in range(1, summaries + 1):
            self.store.delete_key(f"i/{k}/node/{j}")

    # -- who runs where, and who is still heard from ---------------------------------------
    def announce(self, rank: int, process: dict[str, Any]) -> None:
        """Say where this rank runs, once, before anything can go wrong."""
        self._put(f"host/{rank}", json.dumps(process, sort_keys=True))

    def hosts(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """Where each of ``ranks`` said it runs (ranks that have not said yet are left out)."""
        return {r: _json(_text(v)) for r, v in self._fetch([(r, f"host/{r}") for r in ranks]).items()}

    def heartbeat(self, rank: int, now_ns: int, step: int | None = None) -> None:
        """This rank polled now, in training step ``step`` (None: no step counted yet)."""
        self._put(f"hb/{rank}", beat_text(now_ns, step))

    def forget_heard(self) -> None:
        """Forget the heartbeats read so far (a new incident must not say an earlier one's)."""
        self.heard.clear()
        self.steps.clear()

    def last_heard(self, ranks: list[int]) -> dict[int, int]:
        """When each of ``ranks`` last polled the store (wall clock ns); never-heard ranks left out.
        Remembered, with each rank's training step at that beat (:attr:`steps`), for when the store is gone."""
        out: dict[int, int] = {}
        for rank, value in self._fetch([(r, f"hb/{r}") for r in ranks]).items():
            beat = parse_beat(_text(value))
            if beat is not None:
                out[rank] = beat[0]
                self.note_beat(rank, *beat)
        return out

    def note_beat(self, rank: int, ns: int, step: int | None) -> None:
        """One heartbeat of ``rank`` read (its own ``hb/<rank>``, or its node leader's ``nhb/<n>`` for it):
        remembered in :attr:`heard` and :attr:`steps`, the latest beat winning. A time ahead of this
        host's clock (a skewed node, a forged file) counts as now: kept as is, it would make the rank
        look alive for as long as the clock takes to catch up, and a lost host would never be named."""
        ns = min(ns, time.time_ns())
        if ns >= self.heard.get(rank, 0):
            self.heard[rank] = ns
            if step is not None:
                self.steps[rank] = step

    # -- node leaders --------------------------------------------------------------------
    def register_node(self, rank: int, world_size: int) -> int:
        """This node's number, at most ``world_size`` (its leader's heartbeats go under it; readers read no
        further). The next number of the counter, claimed; past the world size (a forged counter, or
        leftovers of restarts) the highest free number below it."""
        token = f"{rank} {uuid.uuid4().hex}"
        n = int(self.store.add("nodes", 1))
        if 1 <= n <= world_size and self._claim(f"nclaim/{n}", token):
            return n
        self.forged("node counter", f"nodes gave number {n} to a job of {world_size} ranks")
        first = world_size - rank % world_size  # leaders' ranks differ: so do their first tries
        for i in range(world_size):
            n = (first - 1 - i) % world_size + 1
            if self._claim(f"nclaim/{n}", token):
                return n
        raise RuntimeError(f"no node number left among {world_size}: every one is claimed")

    def _claim(self, key: str, token: str) -> bool:
        """``key`` was free and now holds this (signed) ``token``."""
        mine = self._sealed(key, token)
        return _bytes(self.store.compare_set(key, "", mine)) == mine

    def node_heartbeat(self, n: int, beat: dict[str, Any]) -> None:
        self._put(f"nhb/{n}", json.dumps(beat, sort_keys=True))

    def node_heartbeats(self, world_size: int) -> dict[int, dict[str, Any]]:
        """Every registered node's latest heartbeat (nodes that never beat are left out), of at most
        ``world_size`` nodes; one naming more than :data:`MAX_RANKS_PER_NODE` ranks is dropped."""
        count = self._count("nodes", world_size, "node counter")
        out = {}
        for n, v in self._fetch([(n, f"nhb/{n}") for n in range(1, count + 1)]).items():
            beat = _json(_text(v))
            ranks = beat.get("ranks")
            if isinstance(ranks, dict) and len(ranks) > MAX_RANKS_PER_NODE:
                self.forged("node heartbeat", f"nhb/{n} names {len(ranks)} ranks, a node runs at most "
                            f"{MAX_RANKS_PER_NODE}")
                continue
            out[n] = beat
        return out

    def publish_summary(self, k: int, summary: bytes, ranks: int) -> None:
        """One node's summary for incident ``k``, covering ``ranks`` ranks' recorders."""
        j = int(self.store.add(f"i/{k}/nodes", 1))
        self._put(f"i/{k}/node/{j}", summary)
        self.store.add(f"i/{k}/arrived", ranks)

    def summaries(self, k: int, world_size: int, skip: int = 0) -> dict[int, bytes]:
        """The node summaries of incident ``k`` there now, past the first ``skip`` (at most one per rank)."""
        count = self._count(f"i/{k}/nodes", world_size, "node summary counter")
        return self._fetch([(j, f"i/{k}/node/{j}") for j in range(skip + 1, count + 1)])

    def ask(self, k: int, ranks: str) -> None:
        """Ask the leaders for the whole recorders of ``ranks`` (runs text; "" asks for none)."""
        self._put(f"i/{k}/need", ranks)

    def asked(self, k: int) -> str | None:
        value = self._get(f"i/{k}/need")
        return _text(value) if value is not None else None

    def publish_whole(self, k: int, rank: int, payload: bytes) -> None:
        """A rank's whole recorder, asked for after its node's summary went (not counted as an arrival)."""
        self._put(f"i/{k}/dump/{rank}", payload)

    # -- who holds the job up without hanging it ----------------------------------------------
    def publish_waits(self, rank: int, summary: dict[str, Any]) -> None:
        """This rank's recent waits, under its own key; the first time, its rank goes on the list of ranks
        that publish so (``w/who``): the comparer then reads only keys that exist (a missing key costs a
        round trip of its own, 100k of them where node leaders carry most ranks' waits)."""
        self._put(f"w/{rank}", json.dumps(summary, separators=(",", ":"), sort_keys=True))
        if rank not in self._listed_waits:  # listed once its key is there
            self.store.append("w/who", f"{rank},")
            self._listed_waits.add(rank)

    def waits(self, world_size: int) -> dict[int, dict[str, Any]]:
        """What the ranks that publish their waits under their own keys last published."""
        raw = _text(self.store.get("w/who")) if self.store.check(["w/who"]) else ""
        listed = raw.split(",", 4 * world_size + 1)[: 4 * world_size + 1]
        ranks = sorted({int(r) for r in listed if r.isascii() and r.isdigit() and len(r) < 10 and int(r) < world_size})
        if len(listed) > 4 * world_size:  # each rank lists itself once (once more per restart)
            self.forged("list of ranks publishing their waits", f"w/who holds over {4 * world_size} entries "
                        f"for {world_size} ranks; the first {4 * world_size} read")
        return {r: _json(_text(v)) for r, v in self._fetch([(r, f"w/{r}") for r in ranks]).items()}

    def publish_files(self, k: int, files: bytes) -> None:
        self._put(f"i/{k}/files", files)

    def files(self, k: int) -> bytes | None:
        return self._get(f"i/{k}/files")

    # -- ranks on their way out ---------------------------------------------------------
    def announce_termination(self, rank: int, incident: int) -> None:
        """This rank received SIGTERM (while part of ``incident``, 0 if none): a peer that then
        waits on it is seeing the end of the job, not a new incident."""
        self._put(f"term/{rank}", str(incident))
        self.store.add("term/count", 1)

    def terminating(self, ranks: Iterable[int]) -> dict[int, int]:
        """Those of ``ranks`` that announced SIGTERM, with their incident; one round trip while
        none has (the usual case), one more per rank asked about once one has."""
        if int(self.store.add("term/count", 0)) == 0:
            return {}
        out: dict[int, int] = {}
        for rank in ranks:
            value = self._get(f"term/{rank}")
            if value is not None:
                text = _text(value)
                out[rank] = int(text) if text.isascii() and text.isdigit() else 0
        return out

    # -- a rank's last words ------------------------------------------------------------
    def publish_final(self, rank: int, payload: bytes) -> None:
        self._put(f"final/{rank}", payload)

    def fetch_final(self, ranks: list[int]) -> dict[int, bytes]:
        return self._fetch([(r, f"final/{r}") for r in ranks])

    def _fetch(self, keys: list[tuple[int, str]]) -> dict[int, bytes]:
        """Two round trips per batch when every key of it is there (``check`` of all, then
        ``multi_get``: never a blocking read of a key that may not come); key by key otherwise. Values that
        do not verify are left out, as if absent."""
        raw = self._fetch_raw(keys)
        names = dict(keys)
        out: dict[int, bytes] = {}
        for rank, value in raw.items():
            opened = self._opened(names[rank], value)
            if opened is not None:
                out[rank] = opened
        return out

    def _fetch_raw(self, keys: list[tuple[int, str]]) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for i in range(0, len(keys), _FETCH_BATCH):
            part = keys[i : i + _FETCH_BATCH]
            names = [key for _, key in part]
            if len(part) > 1 and self.store.check(names):
                try:
                    values = self.store.multi_get(names)
                except (AttributeError, RuntimeError, NotImplementedError):  # a store without multi_get
                    values = None
                if values is not None and len(values) == len(part):
                    out.update((rank, bytes(v)) for (rank, _), v in zip(part, values))
                    continue
            for rank, key in part:
                if self.store.check([key]):
                    out[rank] = bytes(self.store.get(key))
        return out


def _owner(k: int) -> str:
    return f"i/{k}/owner"


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8", "surrogatepass") if isinstance(value, str) else bytes(value)


def _key_kind(key: str) -> str:
    """A key's kind, its numbers left out (``i/3/dump/7`` -> ``i/<n>/dump/<n>``): forgeries are said per kind."""
    return "/".join("<n>" if part.isdigit() else part for part in key.split("/"))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tcp_store(store: Any) -> Any | None:
    """The TCPStore under a chain of PrefixStores, if that is what the default store is."""
    seen = 0
    while store is not None and seen < 16:
        if type(store).__name__ == "TCPStore":
            return store
        store = getattr(store, "underlying_store", None)
        seen += 1
    return None


def connect_channel(dist: Any, job_id: str | None, timeout_s: float = STORE_TIMEOUT_S) -> tuple[IncidentChannel, str]:
    """Open the channel for this job; returns it and the job id (agreed via the store if None).

    Call from the agent's thread once the default process group exists.
    """
    link = StoreLink(timeout_s)
    default = dist.distributed_c10d._get_default_store()
    tcp = _tcp_store(default)
    base: Any = default
    how = "the default store"
    address = f"{tcp.host}:{tcp.port}" if tcp is not None else ""
    if address:
        link.name = f"the job's store at {address}"
    if tcp is not None:
        try:
            base = link.call(lambda: dist.TCPStore(str(tcp.host), int(tcp.port), is_master=False,
                                                   timeout=timedelta(seconds=timeout_s), wait_for_workers=False),
                             "connecting", timeout_s=2 * timeout_s)
            how = f"own connection to {tcp.host}:{tcp.port}"
        except Exception:  # noqa: BLE001 - e.g. a server that refuses more clients
            base = default
    root = dist.PrefixStore("fr_otel/", base)
    if not job_id:
        # Nothing names this run (no torchelastic, Slurm or FR_OTEL_JOB_ID): the first agent
        # to get here proposes one, everyone adopts it. Unique per store, i.e. per run.
        proposal = f"store:{uuid.uuid4().hex}"
        job_id = _text(link.call(lambda: root.compare_set("job_id", "", proposal), "agreeing on the job id"))
    secret = job_secret()
    if secret is None and os.environ.get("LOCAL_RANK", "0") == "0":  # once per node, beside the start line
        log.info("this job has no FR_OTEL_JOB_SECRET: its store records are unauthenticated (anything that reaches "
                 "%s can write them)", address or "the store")
    seal = Seal(secret, job_digest(job_id)) if secret is not None else None
    return IncidentChannel(dist.PrefixStore(f"{job_digest(job_id)}/", root), how, link, address, seal), job_id


def job_digest(job_id: str) -> str:
    """The job's short name in the store's keys (and in node folders): a hash of its identity."""
    return hashlib.blake2b(job_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
