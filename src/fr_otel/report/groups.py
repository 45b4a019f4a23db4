"""The report's Groups section: how far each member of each process group got.

Where the verdict names a rank, this is the evidence a reader can check by hand: per group,
each rank's last enqueued and completed sequence numbers and what it is doing. Groups where
something is stuck come first; big groups fold ranks in the same state into one row.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..common.ranks import compress_ranks
from ..diagnosis.verdict import UNKNOWN_STALL, GroupState
from ..read.dump import Progress
from .facts import Facts
from .markup import badge, esc, fmt_duration

__all__ = ["groups_section"]

MAX_GROUP_BLOCKS = 8  # groups with a table of their own; the rest go into one compact table
PER_RANK_ROWS_UP_TO = 32  # bigger groups get one row per state (ranks folded)
MAX_STATE_ROWS = 40
MAX_COMPACT_GROUPS = 400


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
    age_ns = f.verdict.age_ns(fl.since_ns)
    age = (f", in flight {fmt_duration(age_ns)} when dumped" if age_ns is not None else
           f"; {UNKNOWN_STALL}" if fl.since_ns else "")
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
        x = f.pending_in(r, name)  # the same collective: Facts found it from the same counters
        op = esc(x.op if x is not None else "collective", 80)
        created = x.created_ns if x is not None else None
        age_ns = f.verdict.age_ns(created) if with_age else None
        age = f" for {fmt_duration(age_ns)}" if age_ns is not None else ""
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
            kind = f" {badge(c.kind)}" if c else ""
            lines.append(
                f'<tr{cls}><td>rank {r}{kind}</td><td class="num">{cell(p.enqueued if p else None)}</td>'
                f'<td class="num">{cell(p.completed if p else None)}</td><td class="num">{behind(p)}</td>'
                f'<td>{_rank_in_group(f, g, r, p, max_enq, True)}</td></tr>')
    else:
        classes: dict[tuple[int | None, int | None, str], list[int]] = {}
        for r in pg.ranks:
            p = g.progress.get(r)
            if r in culprit_here:
                c = culprit_here[r]
                lines.append(
                    f'<tr class="culprit"><td>rank {r} {badge(c.kind)}</td><td class="num">'
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


def groups_section(f: Facts) -> str:
    """The Groups section: a table per interesting group, one compact row for each other."""
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

