"""The report's Verdict section: one card per culprit (evidence, where it runs, next step).

The first thing on the page after the headline: a card answers "which rank, why do we
think so, and what do I do now" without scrolling to the tables below.
"""

from __future__ import annotations

from ..common.clock import format_clock
from ..common.ranks import compress_ranks
from ..diagnosis.hosts import LOST_STATES
from ..diagnosis.kinds import KINDS
from ..diagnosis.verdict import Culprit
from .advice import as_html, general_next_step, next_step
from .action import DOMAIN_WORDS, action_html
from .facts import Facts
from .headline import headline
from .markup import badge, esc, seq_label
from .stacks import frame_html
from .text import step_sentence

__all__ = ["verdict_section"]

MAX_CULPRIT_CARDS = 12  # more culprits go into one table


def verdict_section(f: Facts) -> str:
    """The Verdict section: stop order, nodes with several culprits, a card per culprit."""
    v = f.verdict
    out = ['<section id="verdict"><h2>Verdict</h2>']
    if v.stop_order is not None and v.stop_order.lines():
        out.append('<p class="stop-order">' + "<br>".join(esc(line, 300) for line in v.stop_order.lines()[:8])
                   + "</p>")
    for h in [h for h in v.hosts if h.state in LOST_STATES]:
        out.append(f'<p class="node lost"><b>{esc(h.host, 120)}</b> {esc(LOST_STATES[h.state])}: '
                   f'{esc(h.sentence(), 600)}</p>')
    for host, ranks in v.nodes:
        out.append(f'<p class="node"><b>{esc(host, 120)}</b>: ranks {esc(compress_ranks(ranks))} — look at the node</p>')
    if not v.culprits:
        out.append(f'<div class="card noculprit"><p>No culprit rank: {esc(headline(v.verdict).meaning)}.</p>')
        out.append(f'<p class="next"><b>Next step</b> {as_html(general_next_step(v))}</p></div>')
    for c in v.culprits[:MAX_CULPRIT_CARDS]:
        out.append(_culprit_card(f, c))
    if v.waiting:
        items = "".join(f"<li>{esc(w.sentence(), 300)}</li>" for w in v.waiting[:MAX_CULPRIT_CARDS])
        more = f"<li>… and {len(v.waiting) - MAX_CULPRIT_CARDS} more</li>" if len(v.waiting) > MAX_CULPRIT_CARDS else ""
        out.append(f'<div class="card waiting"><p><b>Waiting</b> (stuck only behind the culprits)</p>'
                   f"<ul>{items}{more}</ul></div>")
    rest = v.culprits[MAX_CULPRIT_CARDS:]
    if rest:
        out.append(f'<h3>{len(rest)} more culprits</h3><table class="grid"><thead><tr><th>Rank</th><th>Kind</th>'
                   '<th>Group</th><th>Seq</th><th>Waited on by</th><th>Evidence</th></tr></thead><tbody>')
        for c in rest:
            out.append(
                f'<tr class="culprit"><td>rank {c.rank}</td><td>{badge(c.kind)}</td>'
                f'<td>{esc(c.group_label, 120)}</td><td>{seq_label(c.collective_seq_id)}</td>'
                f'<td>{esc(compress_ranks(c.waiting_ranks)) or "—"}</td><td class="ev">{esc(c.evidence, 400)}</td></tr>')
        out.append("</tbody></table>")
    out.append(action_html(v))
    out.append("</section>")
    return "".join(out)


def _culprit_card(f: Facts, c: Culprit) -> str:
    label = c.group_label + (", send/recv" if c.p2p else "")
    facts = [
        ("Group", f"{esc(label, 160)} <span class=\"dim\">({len(f.job.groups[c.group_name].ranks)} ranks)</span>"
         if c.group_name in f.job.groups else esc(label, 160)),
        ("Collective", f"<code>{esc(c.op or '—', 120)}</code>"),
        ("Sequence number", seq_label(c.collective_seq_id)),
    ]
    if c.waiting_ranks:
        facts.append((KINDS[c.kind].waiters, esc(compress_ranks(c.waiting_ranks, limit=16))))
    if c.waits_on:
        facts.append(("Most likely waits on", esc(f"rank {compress_ranks(c.waits_on)}")))
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
        facts.append(("Now", f"in <code>{esc(c.now.doing, 160)}</code> at {frame_html(c.now.where)}"))
    if c.last_frame is not None:
        facts.append(("Last call site", frame_html(c.last_frame)))
    parts = [
        (f'<article class="card culprit k-{esc(c.kind)}"><header><span class="rank">rank {c.rank}</span>'
         f'{badge(c.kind)}</header>'),
        '<dl class="kv">' + "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in facts) + "</dl>",
        f'<p class="evidence">{esc(c.evidence, 2000)}</p>',
    ]
    if c.cause is not None and c.cause.said:
        lines = "".join(f"<li>{esc(line, 600)}</li>" for line in c.cause.evidence[:8])
        label = c.cause.info.label
        parts.append(f'<div class="cause"><b>Cause</b> {esc(label)}'
                     + (f' <code>{esc(c.cause.cls)}</code>' if label != c.cause.cls else "")
                     + f' <span class="domain">{esc(DOMAIN_WORDS[c.cause.domain])}</span><ul>{lines}</ul></div>')
    parts.append(f'<p class="next"><b>Next step</b> {as_html(next_step(f.verdict, c))}</p>')
    if c.related:
        items = "".join(
            f"<li>{badge(e.kind)} {esc(e.where, 200)}"
            + (f" — waited on by {esc(compress_ranks(e.waiting))}" if e.waiting else "")
            + f'<div class="dim">{esc(e.text, 600)}</div></li>'
            for e in c.related[:24]
        )
        more = f"<li>… and {len(c.related) - 24} more</li>" if len(c.related) > 24 else ""
        parts.append(f'<details class="related"><summary>Also seen in {len(c.related)} other group'
                     f'{"s" if len(c.related) != 1 else ""}</summary><ul>{items}{more}</ul></details>')
    parts.append("</article>")
    return "".join(parts)

