"""A node leader's part in an incident: its ranks' payloads in, one summary out, whole recorders on request.

Each rank of the node leaves its payload in the node's folder (:mod:`..links.node_channel`); the leader waits
(bounded) for its live ranks', reduces them to one compact node summary (:mod:`fr_otel.read.node_summary`; their
whole payloads too when a rank stands out on its node), sends it through the store and says on its board whom
it sent; then it answers the coordinator's request for the whole recorders of the ranks its verdict names
(``i/<k>/need``). A member waits on the board to learn whether its leader sent it, else sends its own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection

from ...common.log import logger
from ...read.dump import RankDump
from ...read.node_summary import encode_node_summary
from ...read.pg_meta import parse_ranks
from ..links.channel import IncidentChannel
from ..links.node_channel import NodeChannel
from ..links.node_leader import NodeRole
from ..links.store_link import StoreUnavailable
from ..observe.last_record import MAX_RECORD_BYTES, load_record
from ..observe.payload import decode_payload, frame_payload

__all__ = ["answer_need", "send_summary", "silent_records", "summarise_node", "wait_until_sent"]

log = logger("fr_otel.agent")

_WAIT_POLL_S = 0.05


def wait_until_sent(role: NodeRole, k: int, until: float) -> bool:
    """A member, after leaving its payload: True once its leader's summary for ``k`` holds it; False
    when the board goes stale, the leader sent without it, or ``until`` (monotonic) passes."""
    while time.monotonic() < until:
        board = role.node.board()
        if board is None or not board.fresh(time.time_ns(), role.poll_interval):
            return False
        if k in board.sent:
            return role.rank in board.sent[k]
        time.sleep(_WAIT_POLL_S)
    return False


def send_summary(role: NodeRole, k: int, until: float, answer_until: float) -> tuple[int, ...]:
    """The leader's part in incident ``k``: wait (until ``until``) for its live ranks' payloads, send the
    node's summary, tell its ranks, and answer the coordinator's request for whole recorders (on a
    thread of its own, until ``answer_until``). Returns the ranks summarised."""
    expected = role.local_ranks(time.time_ns())
    while time.monotonic() < until and len(role.node.ready(k, expected)) < len(expected):
        time.sleep(_WAIT_POLL_S)
    payloads = role.node.payloads(k, expected)
    problems: list[str] = []
    heard = role.node.heard()
    records = silent_records(role.node, heard, expected, role.poll_interval, problems)
    blob, ranks, whole = summarise_node(role.process.host or "", role.rank, payloads, heard, problems, records)
    for line in problems[:4]:
        log.warning("incident %d: %s", k, line)
    role.channel.publish_summary(k, blob, len(ranks))
    role.sent[k] = ranks
    role.publish_board()
    missing = sorted(set(expected) - set(ranks))
    log.info("incident %d: this node's summary sent (%d ranks, %d bytes%s%s%s)", k, len(ranks), len(blob),
             ", whole recorders of its ranks: one stands out" if whole else "",
             f"; rank(s) {missing} left none in time" if missing else "",
             f"; the last records of silent rank(s) {sorted(records)}" if records else "")
    threading.Thread(target=answer_need, args=(role.channel, k, {r: payloads[r] for r in ranks}, answer_until,
                                               role.poll_interval, role.node),
                     name="fr-otel-node-answer", daemon=True).start()
    return ranks


def summarise_node(host: str, leader: int, payloads: dict[int, bytes], heard: dict[int, int],
                   problems: list[str], records: dict[int, bytes] | None = None) -> tuple[bytes, tuple[int, ...], bool]:
    """A node's summary from its ranks' payloads: the blob, the ranks it holds, and whether it carries
    their whole payloads too (a rank stands out on the node). ``records``: the last records of its silent ranks
    (:func:`silent_records`), sent whole beside them."""
    dumps = {r: d for r, d in ((r, decode_payload(p, r, f"rank {r}", problems)) for r, p in payloads.items())
             if d is not None}
    whole = _stands_out(dumps)
    full = ({r: payloads[r] for r in dumps} if whole else {}) | {r: b for r, b in (records or {}).items()
                                                                   if r not in dumps}
    blob = encode_node_summary(host, leader, time.time_ns(), dumps, full=full or None, heard=heard)
    return blob, tuple(sorted(dumps)), whole


def silent_records(node: NodeChannel, heard: dict[int, int], alive: Collection[int], poll_interval: float,
                   problems: list[str]) -> dict[int, bytes]:
    """The last records (:mod:`..observe.last_record`) of this node's ranks that stopped beating (heard from, not
    ``alive``), each as a payload its coordinator decodes like any other; a rank without one, or whose one is
    refused, is one line in ``problems``."""
    out: dict[int, bytes] = {}
    now = time.time_ns()
    for rank, beat in sorted(heard.items()):
        if rank in alive:
            continue
        found = node.record_of(rank, MAX_RECORD_BYTES)
        if found is None:
            problems.append(f"rank {rank} left no last record on its node (it stopped before its agent's first poll, "
                            "or its agent was off)")
            continue
        got = load_record(found[0], found[1], rank, pid=None, heard_ns=beat, now_ns=now, poll_interval=poll_interval,
                          source=f"rank {rank} (its last record, on its node)")
        if isinstance(got, str):
            problems.append(f"rank {rank}'s last record on its node is not used: {got}")
            continue
        dump, kept = got
        assert dump.record is not None
        out[rank] = frame_payload(kept, dump.record.as_of_ns, level=0)
    return out


def _stands_out(dumps: dict[int, RankDump]) -> bool:
    """A rank of this node got somewhere else than its node-mates in a group they share (or failed):
    a likely culprit, so the node sends its ranks' whole recorders (the culprit's and its peers')."""
    seen: dict[str, set[tuple[int, int]]] = {}
    for dump in dumps.values():
        if dump.failed:
            return True
        for name, h in dump.histories.items():
            status = dump.pg_status.get(h.local_id)
            pending = h.completed.find(0)
            where = (status.enqueued if status else (h.seq[-1] if len(h.seq) else -1),
                     h.seq[pending] if pending >= 0 else -1)
            seen.setdefault(name, set()).add(where)
    return any(len(states) > 1 for states in seen.values())


def answer_need(channel: IncidentChannel, k: int, payloads: dict[int, bytes], until: float,
                poll_interval: float, node: NodeChannel | None = None) -> None:
    """Once the coordinator says which ranks it needs whole, send those of ``payloads`` (polls, bounded),
    unless its verdict is already out; if it came out meanwhile, take back what was sent (the coordinator
    cleans the store once, after its verdict: a recorder sent later would stay for the job's life). Then
    the node's copies of the incident's recorders go (``node``)."""
    try:
        while time.monotonic() < until:
            try:
                asked = channel.asked(k)
                if asked is not None:
                    mine = [r for r in parse_ranks(f"[{asked}]") or () if r in payloads]
                    if mine and not channel.concluded(k):
                        for rank in mine:
                            channel.publish_whole(k, rank, payloads[rank])
                        if channel.concluded(k):
                            channel.cleanup(k, mine)
                    return
            except StoreUnavailable:
                pass
            except Exception as exc:  # noqa: BLE001 - a log line, never the training job's problem
                log.debug("incident %d: answering the coordinator: %s", k, exc)
                return
            time.sleep(poll_interval)
    finally:
        if node is not None:
            node.forget(k)
