"""The incident as one self-contained HTML page: verdict, timeline, groups, stacks, problems.

``render(job, verdict)`` returns a complete document: CSS, SVG and a little JavaScript are
inline, nothing is fetched (a Content-Security-Policy forbids it), no font is loaded, and
every piece of information is in the HTML itself (JavaScript only adds highlighting and
click details; print CSS lays it out on paper). Everything taken from dumps (file names,
group descs, stack frames, ops) is HTML-escaped. Pure: same input, same bytes; no clock,
no file system, no torch.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import os
from collections.abc import Iterable
from importlib import resources

from ..version import __version__
from ..common.files import atomic_write
from ..common.ranks import compress_ranks
from ..diagnosis.analysis import Culprit, GroupState, Verdict
from ..diagnosis.job import Job
from ..diagnosis.stop_order import format_clock
from ..incident.delivery import replay_command
from ..read.dump import Entry, Frame, Progress
from .text import step_sentence
from .timeline import (
    Facts,
    esc,
    fmt_duration,
    fmt_rel,
    history_at,
    render_timeline,
    tail_entry,
)

__all__ = ["render", "write_report"]

MAX_CULPRIT_CARDS = 12
MAX_GROUP_BLOCKS = 8
PER_RANK_ROWS_UP_TO = 32  # bigger groups get one row per state (ranks folded)
MAX_STATE_ROWS = 40
MAX_STACKS = 8
MAX_FRAMES = 40
MAX_PROBLEMS = 300
MAX_COMPACT_GROUPS = 400

_HEADLINES = {
    "hang": "Hang",
    "desync": "Desync",
    "straggler": "Straggler",
    "healthy": "Healthy",
    "inconclusive": "Inconclusive",
}
_VERDICT_MEANING = {
    "hang": "ranks are blocked in a collective that some rank never finishes",
    "desync": "ranks disagree on a collective (different op, sizes or dtypes at the same sequence number)",
    "straggler": "no collective is stuck, but a rank is consistently late",
    "healthy": "no collective stuck, no mismatch, no straggler in the recorded window",
    "inconclusive": "the dumps do not single out a rank",
}
_KIND_TEXT = {
    "not_enqueued": "never enqueued",
    "not_completed": "did not complete",
    "mismatch": "mismatch",
    "missing_dump": "no dump",
    "straggler": "straggler",
}


def render(
    job: Job,
    verdict: Verdict,
    *,
    trace_id: str | None = None,
    destination: str | None = None,
    export_status: str | None = None,
) -> str:
    """The report as one HTML document (a ``str``; write it as UTF-8).

    ``trace_id`` (32 hex digits) and ``destination`` (the OTLP endpoint or the JSON Lines
    file the trace went to) come from ``fr-otel export``; ``export_status`` is its outcome
    (``sent``, ``file``, ``spooled``, ``failed``, ``disabled``), inferred when omitted.
    """
    f = Facts.of(job, verdict)
    culprit_text = _culprit_ranks_text(verdict)
    title = f"fr-otel: {_HEADLINES.get(verdict.verdict, verdict.verdict).upper()}" + (
        f" — {culprit_text}" if culprit_text else "")
    body = [
        _header(f, culprit_text),
        '<main>',
        _verdict_section(f),
        _timeline_section(f),
        _groups_section(f),
        _stacks_section(f),
        _notes_section(f),
        _trace_section(trace_id, destination, export_status),
        '</main>',
        _footer(f),
    ]
    script = _SCRIPT
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
           "base-uri 'none'; form-action 'none'")
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{csp}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta name="color-scheme" content="light">'
        f'<meta name="generator" content="fr-otel {esc(__version__)}">'
        f"<title>{esc(title, 200)}</title><style>{_CSS}</style></head>\n"
        f'<body class="v-{esc(verdict.verdict)}">\n' + "\n".join(p for p in body if p) +
        f"\n<script>{script}</script>\n</body></html>\n"
    )


def write_report(path: str | os.PathLike[str], document: str) -> int:
    """Write ``document`` atomically as UTF-8 (see :mod:`fr_otel.common.files`); returns its size in bytes."""
    data = document.encode("utf-8", "replace")
    atomic_write(path, data)
    return len(data)


# --------------------------------------------------------------------------- header and verdict


def _culprit_ranks_text(v: Verdict) -> str:
    if not v.culprits:
        return ""
    ranks = [c.rank for c in v.culprits]
    return f"culprit rank{'s' if len(ranks) > 1 else ''} {compress_ranks(ranks, limit=16)}"


def _when(ns: int | None) -> str:
    if not ns:
        return "unknown"
    t = _dt.datetime.fromtimestamp(ns / 1e9, tz=_dt.timezone.utc)
    return t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d} UTC"


def _header(f: Facts, culprit_text: str) -> str:
    v = f.verdict
    loaded = f"{v.ranks_loaded} of {v.world_size}" if v.world_size else str(v.ranks_loaded)
    backend = "/".join(v.backends) or "unknown backend"
    source = {"dump_files": "dump file times", "latest_activity": "newest recorded activity"}.get(v.reference_source, "")
    stuck = [g for g in v.groups if g.in_flight is not None]
    facts = [
        ("Ranks loaded", f"{loaded} ({backend})"),
        ("Process groups", f"{len(v.groups)}" + (f", {len(stuck)} with a collective in flight" if stuck else "")),
        ("Reference time", f"{_when(v.reference_ns)}" + (f" ({source})" if source else "")),
    ]
    if v.missing_ranks:
        facts.append(("No dump from", compress_ranks(v.missing_ranks)))
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in (
        ("verdict", "Verdict"), ("timeline", "Timeline"), ("groups", "Groups"), ("stacks", "Stacks"),
        ("notes", "Notes &amp; problems"), ("trace", "Trace")))
    headline = esc(_HEADLINES.get(v.verdict, v.verdict).upper())
    who = f'<span class="sep"> — </span><span class="who">{esc(culprit_text)}</span>' if culprit_text else ""
    return (
        '<header class="top"><div class="wrap">'
        '<div class="brand">fr-otel · incident report</div>'
        f'<h1><span class="verdict-word">{headline}</span>{who}</h1>'
        f'<p class="meaning">{esc(_VERDICT_MEANING.get(v.verdict, ""))}</p>'
        '<dl class="facts">' + "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(val)}</dd></div>" for k, val in facts) +
        f'</dl><nav aria-label="sections">{nav}</nav></div></header>'
    )


def _verdict_section(f: Facts) -> str:
    v = f.verdict
    out = ['<section id="verdict"><h2>Verdict</h2>']
    if v.stop_order is not None and v.stop_order.sentence():
        out.append(f'<p class="stop-order">{esc(v.stop_order.sentence(), 600)}</p>')
    for host, ranks in v.nodes:
        out.append(f'<p class="node"><b>{esc(host, 120)}</b>: ranks {esc(compress_ranks(ranks))} — look at the node</p>')
    if not v.culprits:
        out.append(f'<div class="card noculprit"><p>No culprit rank: {esc(_VERDICT_MEANING.get(v.verdict, ""))}.</p>')
        out.append(f'<p class="next"><b>Next step</b> {_general_next_step(f)}</p></div>')
    for c in v.culprits[:MAX_CULPRIT_CARDS]:
        out.append(_culprit_card(f, c))
    rest = v.culprits[MAX_CULPRIT_CARDS:]
    if rest:
        out.append(f'<h3>{len(rest)} more culprits</h3><table class="grid"><thead><tr><th>Rank</th><th>Kind</th>'
                   '<th>Group</th><th>Seq</th><th>Waited on by</th><th>Evidence</th></tr></thead><tbody>')
        for c in rest:
            out.append(
                f'<tr class="culprit"><td>rank {c.rank}</td><td>{_badge(c.kind)}</td>'
                f'<td>{esc(f.group_label(c.group_name), 120)}</td><td>{_seq(c.collective_seq_id)}</td>'
                f'<td>{esc(compress_ranks(c.waiting_ranks)) or "—"}</td><td class="ev">{esc(c.evidence, 400)}</td></tr>')
        out.append("</tbody></table>")
    out.append("</section>")
    return "".join(out)


def _badge(kind: str) -> str:
    return f'<span class="badge k-{esc(kind)}">{esc(_KIND_TEXT.get(kind, kind))}</span>'


def _seq(seq: int | None) -> str:
    return f"#{seq}" if seq is not None else "—"


def _culprit_card(f: Facts, c: Culprit) -> str:
    label = f.group_label(c.group_name)
    facts = [
        ("Group", f"{esc(label, 160)} <span class=\"dim\">({len(f.job.groups[c.group_name].ranks)} ranks)</span>"
         if c.group_name in f.job.groups else esc(label, 160)),
        ("Collective", f"<code>{esc(c.op or '—', 120)}</code>"),
        ("Sequence number", _seq(c.collective_seq_id)),
    ]
    if c.waiting_ranks:
        who = "Its peers (called differently)" if c.kind == "mismatch" else "Waited on by"
        facts.append((who, esc(compress_ranks(c.waiting_ranks, limit=16))))
    if c.host:
        facts.append(("Host", f"<code>{esc(c.host, 120)}</code>"))
    if c.node and c.node != c.host:
        facts.append(("Node (Slurm)", f"<code>{esc(c.node, 120)}</code>"))
    if c.step is not None or c.collective_step is not None:
        facts.append(("Training step", esc(step_sentence(c, f.verdict.steps), 400)))
    if c.stopped_ns is not None:
        when = format_clock(c.stopped_ns)
        if c.stopped_after_s is not None:
            when += " — first to stop" if c.stopped_after_s == 0 else f" — {c.stopped_after_s:.3f} s after the first"
        facts.append(("Stopped", esc(when)))
    if c.process is not None and c.process.pid is not None:
        facts.append(("Process id", f"<code>{c.process.pid}</code>"))
    if c.now is not None and c.now.where is not None:
        facts.append(("Now", f"in <code>{esc(c.now.doing, 160)}</code> at {_frame_html(c.now.where)}"))
    if c.last_frame is not None:
        facts.append(("Last call site", _frame_html(c.last_frame)))
    parts = [
        (f'<article class="card culprit k-{esc(c.kind)}"><header><span class="rank">rank {c.rank}</span>'
         f'{_badge(c.kind)}</header>'),
        '<dl class="kv">' + "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in facts) + "</dl>",
        f'<p class="evidence">{esc(c.evidence, 2000)}</p>',
        f'<p class="next"><b>Next step</b> {_next_step(f, c)}</p>',
    ]
    if c.related:
        items = "".join(
            f"<li>{_badge(e.kind)} {esc(f.group_label(e.group), 120)} {_seq(e.seq)}"
            + (f" — waited on by {esc(compress_ranks(e.waiting))}" if e.waiting else "")
            + f'<div class="dim">{esc(e.text, 600)}</div></li>'
            for e in c.related[:24]
        )
        more = f"<li>… and {len(c.related) - 24} more</li>" if len(c.related) > 24 else ""
        parts.append(f'<details class="related"><summary>Also seen in {len(c.related)} other group'
                     f'{"s" if len(c.related) != 1 else ""}</summary><ul>{items}{more}</ul></details>')
    parts.append("</article>")
    return "".join(parts)


def _py_spy(c: Culprit, what: str = "dump") -> str:
    """The py-spy command for this culprit, with its real host and pid when known."""
    p = c.process
    pid = str(p.pid) if p is not None and p.pid is not None else "PID"
    host = p.host if p is not None and p.host else c.host
    cmd = f"py-spy {what} --pid {pid}"
    if host:
        cmd = f"ssh {host} {cmd}"
    return f"<code>{esc(cmd, 400)}</code>"


def _next_step(f: Facts, c: Culprit) -> str:
    r = c.rank
    op = esc((c.op or "the collective").partition(":")[2] or c.op or "the collective", 80)
    seq = _seq(c.collective_seq_id)
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
    if c.kind == "straggler":
        return (f"Nothing hangs, but rank {r} is consistently the last to enqueue. Profile it "
                f"({_py_spy(c, 'top')}, the torch profiler): data loading, CPU contention, thermal "
                "throttling or a slower host. A constant offset can also be clock skew between hosts: compare "
                "their clocks before blaming the rank.")
    return "Look at this rank's process and host around the reference time."


def _general_next_step(f: Facts) -> str:
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


# --------------------------------------------------------------------------- timeline


def _timeline_section(f: Facts) -> str:
    svg = render_timeline(f)
    if not svg:
        return ('<section id="timeline"><h2>Timeline</h2><p class="dim">The dumps record no times: '
                "nothing to draw.</p></section>")
    n = len(f.ranks)
    intro = ("One lane per rank" if n <= 32 else
             f"The culprits and a sample of the ranks waiting on them have their own lane; the other of the {n} "
             "ranks are folded, by what they are doing, into summary lanes (their median rank, with counts)")
    return (
        '<section id="timeline"><h2>Timeline</h2>'
        f'<p class="lead">{intro}. Each bar is a collective from enqueue to completion; an arrow means it was still '
        "in flight at the reference time.</p>"
        f'<div class="tl-box">{svg}</div><p id="tl-info" class="tl-info" hidden></p></section>'
    )


# --------------------------------------------------------------------------- groups


def _group_order(f: Facts) -> list[GroupState]:
    culprit_groups = {c.group_name for c in f.verdict.culprits}
    focus = f.focus[0] if f.focus else None

    def key(g: GroupState) -> tuple[int, int, str]:
        fl = g.in_flight
        rank = (0 if g.group.name == focus else 1 if g.group.name in culprit_groups else
                2 if fl is not None and fl.not_entered else 3 if fl is not None else 4)
        return rank, (fl.since_ns or 0) if fl else 0, g.group.name

    return sorted(f.verdict.groups, key=key)


def _group_in_flight_text(f: Facts, g: GroupState) -> str:
    fl = g.in_flight
    if fl is None:
        return ""
    age = f", in flight {fmt_duration(f.ref - fl.since_ns)}" if f.ref and fl.since_ns else ""
    missing = f"; not entered: {compress_ranks(fl.not_entered)}" if fl.not_entered else ""
    return f"{fl.op or 'collective'} #{fl.seq} entered by {compress_ranks(fl.entered) or 'none'}{missing}{age}"


def _rank_in_group(f: Facts, g: GroupState, r: int, p: Progress | None, max_enq: int, with_age: bool) -> str:
    """What rank ``r`` does in group ``g``, as escaped HTML."""
    if r not in f.job.dumps:
        return "no dump"
    if p is None:
        return "no record of this group in its dump"
    name = g.group.name
    if p.completed < p.enqueued:
        seq = p.completed + 1
        d = f.job.dumps.get(r)
        e = tail_entry(d, name, seq)
        h = None if e is not None else history_at(d, name, seq)
        op = esc(e.op if e is not None else h[0] if h else "collective", 80)
        created = e.time_created_ns if e is not None else h[1] if h else None
        age = f" for {fmt_duration(f.ref - created)}" if with_age and created and f.ref else ""
        others_done = g.in_flight is not None and g.in_flight.seq != seq
        verb = "stuck in" if others_done else "in"
        return f"{verb} {op} #{seq}{age} (not completed)"
    if p.enqueued < max_enq:
        text = f"never enqueued #{p.enqueued + 1}"
        elsewhere = [x for x in f.pending.get(r, []) if x.group.name != name]
        if elsewhere:
            x = elsewhere[0]
            text += f"; busy in {esc(x.op, 80)} #{x.seq} on {esc(x.group.label, 120)}"
        else:
            text += "; nothing in flight anywhere"
        return text
    return "up to date, nothing in flight"


def _group_block(f: Facts, g: GroupState) -> str:
    known = {r: p for r, p in g.progress.items() if p is not None}
    max_enq = max((p.enqueued for p in known.values()), default=-1)
    max_comp = max((p.completed for p in known.values()), default=-1)
    pg = g.group
    culprit_here = {c.rank: c for c in f.verdict.culprits
                    if c.group_name == pg.name or any(e.group == pg.name for e in c.related)}
    head = (f'<h3>{esc(pg.label, 160)} <span class="dim">· {len(pg.ranks)} rank{"s" if len(pg.ranks) != 1 else ""}'
            f' · members from {esc(pg.membership)}</span></h3>')
    fl = _group_in_flight_text(f, g)
    lines = [f'<div class="group-block" id="group-{esc(pg.name, 80)}">', head]
    if fl:
        lines.append(f'<p class="inflight"><b>In flight:</b> {esc(fl, 800)}</p>')
    if g.note:
        lines.append(f'<p class="dim">{esc(g.note, 600)}</p>')
    lines.append('<table class="grid ranks"><colgroup><col class="c-rank"><col class="c-n"><col class="c-n">'
                 '<col class="c-n"><col></colgroup><thead><tr><th>Rank</th><th class="num">Enqueued</th><th class="num">Completed'
                 '</th><th class="num">Behind</th><th>Doing</th></tr></thead><tbody>')

    def cell(val: int | None) -> str:
        return "—" if val is None or val < 0 else f"#{val}"

    def behind(p: Progress | None) -> str:
        if p is None:
            return "—"
        lag = max_enq - p.enqueued
        lag_c = max_comp - p.completed
        text = f"{lag}" if lag else "0"
        if lag == 0 and lag_c > 0:
            text += f' <span class="dim">({lag_c} not completed)</span>'
        return text

    if len(pg.ranks) <= PER_RANK_ROWS_UP_TO:
        for r in pg.ranks:
            p = g.progress.get(r)
            c = culprit_here.get(r)
            cls = ' class="culprit"' if c else ""
            badge = f" {_badge(c.kind)}" if c else ""
            lines.append(
                f'<tr{cls}><td>rank {r}{badge}</td><td class="num">{cell(p.enqueued if p else None)}</td>'
                f'<td class="num">{cell(p.completed if p else None)}</td><td class="num">{behind(p)}</td>'
                f'<td>{_rank_in_group(f, g, r, p, max_enq, True)}</td></tr>')
    else:
        classes: dict[tuple[int | None, int | None, str], list[int]] = {}
        for r in pg.ranks:
            p = g.progress.get(r)
            if r in culprit_here:
                c = culprit_here[r]
                lines.append(
                    f'<tr class="culprit"><td>rank {r} {_badge(c.kind)}</td><td class="num">'
                    f'{cell(p.enqueued if p else None)}</td><td class="num">{cell(p.completed if p else None)}</td>'
                    f'<td class="num">{behind(p)}</td><td>{_rank_in_group(f, g, r, p, max_enq, True)}</td></tr>')
                continue
            doing = _rank_in_group(f, g, r, p, max_enq, False)
            classes.setdefault((p.enqueued if p else None, p.completed if p else None, doing), []).append(r)
        ordered = sorted(classes.items(), key=lambda kv: -len(kv[1]))
        for (enq, comp, doing), ranks in ordered[:MAX_STATE_ROWS]:
            p = g.progress.get(ranks[0])
            lines.append(
                f'<tr><td>{len(ranks)} rank{"s" if len(ranks) != 1 else ""} <span class="dim">'
                f'{esc(compress_ranks(ranks, limit=8))}</span></td><td class="num">{cell(enq)}</td>'
                f'<td class="num">{cell(comp)}</td><td class="num">{behind(p)}</td><td>{doing}</td></tr>')
        if len(ordered) > MAX_STATE_ROWS:
            left = [r for _, rs in ordered[MAX_STATE_ROWS:] for r in rs]
            lines.append(f'<tr><td colspan="5" class="dim">… {len(left)} more ranks in {len(ordered) - MAX_STATE_ROWS}'
                         f' other states: {esc(compress_ranks(left))}</td></tr>')
    lines.append("</tbody></table></div>")
    return "".join(lines)


def _groups_section(f: Facts) -> str:
    groups = _group_order(f)
    if not groups:
        return '<section id="groups"><h2>Process groups</h2><p class="dim">No process group found.</p></section>'
    interesting = [g for g in groups if g.in_flight is not None or any(
        c.group_name == g.group.name for c in f.verdict.culprits)]
    full = (interesting or groups)[:MAX_GROUP_BLOCKS]
    shown = {g.group.name for g in full}
    out = ['<section id="groups"><h2>Process groups</h2>',
           ('<p class="lead">How far each member enqueued and completed; "behind" counts the collectives a rank has '
            'not enqueued yet that a peer has. Groups where something is stuck come first.</p>')]
    out.extend(_group_block(f, g) for g in full)
    rest = [g for g in groups if g.group.name not in shown]
    if rest:
        stuck = sum(1 for g in rest if g.in_flight is not None)
        what = f"{len(rest)} more group{'s' if len(rest) != 1 else ''}" + (f" ({stuck} with a collective in flight)"
                                                                            if stuck else ", nothing in flight")
        out.append(f'<details class="more-groups"{" open" if stuck else ""}><summary>{what}</summary>'
                   '<table class="grid compact"><thead><tr><th>Group</th><th class="num">Size</th><th class="num">'
                   'Enqueued</th><th class="num">Completed</th><th>In flight</th></tr></thead><tbody>')
        for g in rest[:MAX_COMPACT_GROUPS]:
            known = [p for p in g.progress.values() if p is not None]
            enq = _range(p.enqueued for p in known)
            comp = _range(p.completed for p in known)
            out.append(f'<tr><td>{esc(g.group.label, 160)}</td><td class="num">{len(g.group.ranks)}</td>'
                       f'<td class="num">{enq}</td><td class="num">{comp}</td>'
                       f'<td>{esc(_group_in_flight_text(f, g), 600) or "—"}</td></tr>')
        if len(rest) > MAX_COMPACT_GROUPS:
            out.append(f'<tr><td colspan="5" class="dim">… {len(rest) - MAX_COMPACT_GROUPS} more (see '
                       '<code>fr-otel analyze --json</code>)</td></tr>')
        out.append("</tbody></table></details>")
    out.append("</section>")
    return "".join(out)


def _range(values: Iterable[int]) -> str:
    vals = list(values)
    if not vals:
        return "—"
    lo, hi = min(vals), max(vals)
    return f"#{lo}" if lo == hi else f"#{lo}–#{hi}"


# --------------------------------------------------------------------------- stacks


def _frame_class(fr: Frame) -> str:
    """``torch`` (inside torch), ``lib`` (stdlib, other installed packages, generated code), ``user``."""
    path = fr.filename.replace("\\", "/")
    if "/torch/" in path:
        return "torch"
    if path.startswith("<") or "/site-packages/" in path or "/dist-packages/" in path or (
            "/lib/python3" in path):
        return "lib"
    return "user"


def _short_path(path: str) -> str:
    """Installed and standard-library files without their install prefix (the full path is
    the frame's tooltip)."""
    for marker in ("/site-packages/", "/dist-packages/", "/lib/python3"):
        i = path.find(marker)
        if i > 0:
            return "…" + path[i:]
    return path


def _frame_html(fr: Frame) -> str:
    return (f'<code class="frame" title="{esc(fr.filename, 1000)}">{esc(_short_path(fr.filename), 300)}:{fr.line}'
            f'</code> in <code>{esc(fr.name, 160)}</code>')


def _frames_list(frames: tuple[Frame, ...], other: tuple[Frame, ...] | None = None) -> str:
    """Frames innermost first; the innermost user frame is the call site; with ``other``
    (a peer's stack), frames the peer does not share are marked."""
    shown = frames[:MAX_FRAMES]
    theirs = {(fr.filename, fr.line) for fr in other} if other is not None else None
    call_site = next((i for i, fr in enumerate(shown) if _frame_class(fr) == "user"), None)
    items = []
    for i, fr in enumerate(shown):
        cls = [_frame_class(fr)]
        tags = ""
        if theirs is not None and (fr.filename, fr.line) not in theirs:
            cls.append("differs")
            tags += ' <span class="tag differs">differs</span>'
        if i == call_site:
            tags += ' <span class="tag site">call site</span>'
        items.append(f'<li class="{" ".join(cls)}">{_frame_html(fr)}{tags}</li>')
    more = f'<li class="dim">… {len(frames) - MAX_FRAMES} more frames</li>' if len(frames) > MAX_FRAMES else ""
    return f'<ol class="stack">{"".join(items)}{more}</ol>'


def _entry(f: Facts, rank: int, group: str, seq: int) -> Entry | None:
    """The whole entry (stack included): from the tail, else from the rank's full dump."""
    e = tail_entry(f.job.dumps.get(rank), group, seq)
    if e is not None:
        return e
    found = f.job.entries_at(rank, group, seq)
    return found[0] if found else None


def _stack_entry(f: Facts, c: Culprit) -> tuple[Entry | None, str]:
    """The entry whose stack explains ``c``, and what it is."""
    if c.kind in ("mismatch", "not_completed") and c.collective_seq_id is not None:
        e = _entry(f, c.rank, c.group_name, c.collective_seq_id)
        if e is not None:
            return e, f"the call of {e.profiling_name} #{e.collective_seq_id} on {f.group_label(e.pg_name)}"
    d = f.job.dumps.get(c.rank)
    if d is None or not d.tail:
        return None, ""
    e = d.tail[-1]  # the tail ends with the newest entry
    return e, (f"its last enqueued collective, {e.profiling_name} #{e.collective_seq_id} on "
               f"{f.group_label(e.pg_name)} ({fmt_rel(e.time_created_ns - f.ref) if f.ref else ''})")


def _now_block(c: Culprit) -> str:
    """The culprit's threads at incident time (the live agent's capture), main thread first."""
    assert c.now is not None and c.now.main is not None
    who = f" ({esc(c.process.label, 300)})" if c.process is not None and c.process.label else ""
    head = (f'<h3 class="now">rank {c.rank}{who} {_badge(c.kind)} <span class="dim">· now: where its threads were '
            f"when the incident was raised, {esc(c.now.describe(), 400)}</span></h3>")
    main = c.now.main
    block = f"<h4>{esc(main.name, 120)}</h4>" + _frames_list(main.frames)
    others = "".join(f"<h4>{esc(t.name, 120)}</h4>" + _frames_list(t.frames) for t in c.now.threads[1:])
    if others:
        block += (f'<details class="threads"><summary>{len(c.now.threads) - 1} other thread'
                  f'{"s" if len(c.now.threads) != 2 else ""}</summary>{others}</details>')
    return head + block


def _stacks_section(f: Facts) -> str:
    v = f.verdict
    out = ['<section id="stacks"><h2>Stacks</h2>']
    if not v.culprits:
        out.append('<p class="dim">No culprit, no stack to show.</p></section>')
        return "".join(out)
    any_frames = any(d.has_frames for d in f.job.dumps.values())
    now = [_now_block(c) for c in v.culprits[:MAX_STACKS] if c.now is not None and c.now.main is not None]
    if any_frames or now:
        out.append('<p class="lead">Innermost frame first. Your code in bold, torch and the standard library dimmed; '
                   "the call site is the innermost frame of your code. <b>Now</b>: where the culprit's threads were "
                   "when the live agent raised the incident; below it, the stack of its last collective.</p>")
    out.extend(now)
    if not any_frames:
        out.append('<p class="dim">These dumps hold no Python stacks of their collectives (JSON dumps never do; '
                   "pickled dumps do when the recorder captured stack traces). The evidence above still names the "
                   "ranks; <code>py-spy dump</code> on a live culprit shows where it is.</p></section>")
        return "".join(out)
    for c in v.culprits[:MAX_STACKS]:
        e, what = _stack_entry(f, c)
        head = f'<h3>rank {c.rank} {_badge(c.kind)} <span class="dim">· {esc(what, 300)}</span></h3>'
        if e is None or not e.frames:
            out.append(head + '<p class="dim">No stack recorded for this rank.</p>')
            continue
        block = _frames_list(e.frames)
        if c.kind == "mismatch" and c.collective_seq_id is not None:
            peer_html = '<p class="dim">No peer stack at this sequence number.</p>'
            peers = [w for w in c.waiting_ranks[:16]]
            found = [tail_entry(f.job.dumps.get(w), c.group_name, c.collective_seq_id) for w in peers]
            if not any(found):  # older than the tails: load (at most) two peers' full dumps
                found = [_entry(f, w, c.group_name, c.collective_seq_id) for w in peers[:2]]
            for w, pe in zip(peers, found):
                if pe is not None and pe.frames:
                    block = _frames_list(e.frames, pe.frames)
                    peer_html = (f'<h4>rank {w} (a peer): {esc(pe.profiling_name, 80)} #{pe.collective_seq_id}</h4>'
                                 + _frames_list(pe.frames, e.frames))
                    break
            block = (f'<div class="compare"><div><h4>rank {c.rank}: {esc(e.profiling_name, 80)} '
                     f'#{e.collective_seq_id}</h4>{block}</div><div>{peer_html}</div></div>')
        out.append(head + block)
    if len(v.culprits) > MAX_STACKS:
        out.append(f'<p class="dim">… stacks of {len(v.culprits) - MAX_STACKS} more culprits left out.</p>')
    out.append("</section>")
    return "".join(out)


# --------------------------------------------------------------------------- notes, problems, trace, footer


def _notes_section(f: Facts) -> str:
    v = f.verdict
    out = ['<section id="notes"><h2>Notes &amp; problems</h2>']
    if v.notes:
        out.append("<h3>Notes</h3><ul>" + "".join(f"<li>{esc(n, 1000)}</li>" for n in v.notes) + "</ul>")
    if v.problems:
        out.append(f"<h3>Problems reading the dumps ({len(v.problems)})</h3><ul class=\"problems\">"
                   + "".join(f"<li>{esc(p, 1000)}</li>" for p in v.problems[:MAX_PROBLEMS]) + "</ul>")
        if len(v.problems) > MAX_PROBLEMS:
            out.append(f'<p class="dim">… {len(v.problems) - MAX_PROBLEMS} more (<code>fr-otel analyze --json'
                       "</code> lists them all).</p>")
    else:
        out.append('<p class="ok">Every dump was read without a problem.</p>')
    out.append("</section>")
    return "".join(out)


def _trace_section(trace_id: str | None, destination: str | None, status: str | None) -> str:
    out = ['<section id="trace"><h2>Trace</h2>']
    if not trace_id:
        out.append("<p>Not exported. <code>fr-otel export PATH --html FILE</code> sends the same incident as one "
                   "OpenTelemetry trace (a span per collective per rank, linked across ranks) and names it here.</p>")
        out.append("</section>")
        return "".join(out)
    tid = esc(trace_id, 64)
    dest = esc(destination or "", 500)
    if status is None:
        status = "file" if destination and destination.endswith(".jsonl") else "sent" if destination else ""
    out.append(f'<p>Trace id <code class="tid">{tid}</code></p>')
    if status == "file":
        out.append(
            f"<p>Written to <code>{dest}</code> (OTLP JSON Lines).</p><ul>"
            "<li><b>Jaeger</b>: Search → Upload → choose that file.</li>"
            f"<li><b>Tempo / any OTLP backend</b>: <code>{esc(replay_command(destination or ''), 600)}</code>, then open "
            "the trace by its id.</li></ul>")
    elif status == "sent":
        out.append(
            f"<p>Sent to <code>{dest}</code>.</p><ul>"
            f"<li><b>Grafana Tempo</b>: Explore → Tempo → TraceQL, paste <code>{tid}</code> (or query "
            "<code>{ span.fr_otel.verdict != nil }</code>).</li>"
            f"<li><b>Jaeger</b>: paste <code>{tid}</code> in the search box, or open "
            f"<code>JAEGER_URL/trace/{tid}</code>.</li></ul>")
    elif status == "spooled":
        out.append(f'<p class="warn">Not delivered to its endpoint; spooled to <code>{dest}</code>. Send it later with '
                   f"<code>{esc(replay_command(destination or ''), 600)}</code> (your collector's endpoint), then "
                   "open it by its id.</p>")
    elif status == "disabled":
        out.append("<p>Not exported: <code>OTEL_SDK_DISABLED=true</code>.</p>")
    else:
        out.append(f'<p class="warn">Export failed{": " + dest if dest else ""}.</p>')
    out.append("</section>")
    return "".join(out)


def _footer(f: Facts) -> str:
    paths = [d.path for d in f.job.dumps.values()]
    where = ""
    if paths:
        try:
            common = os.path.commonpath(paths) if len(paths) > 1 else paths[0]
        except ValueError:
            common = ""
        where = f" from {len(paths)} dump file{'s' if len(paths) != 1 else ''}" + (
            f" under <code>{esc(common, 300)}</code>" if common else "")
    return (f'<footer><div class="wrap">Generated by fr-otel {esc(__version__)}{where}. Self-contained: this page '
            "loads nothing from the network.</div></footer>")


# --------------------------------------------------------------------------- assets


def _asset(name: str) -> str:
    """A file of ``report/assets`` (package data, shipped in the wheel): CSS and JavaScript
    live in files of their own so editors, linters and diffs treat them as what they are."""
    return "\n" + resources.files("fr_otel.report").joinpath("assets", name).read_text(encoding="utf-8")


_CSS = _asset("report.css")
_SCRIPT = _asset("report.js")
