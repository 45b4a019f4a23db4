"""The report's Stacks section: where each culprit was, as Python frames.

Innermost frame first, the user's call site marked, torch and the standard library dimmed;
for a mismatch the culprit's stack is set beside a peer's with the frames that differ
marked (that is usually the bug). The live agent's capture ("now") comes first.
"""

from __future__ import annotations

from ..diagnosis.kinds import CulpritKind
from ..diagnosis.verdict import Culprit
from ..read.dump import Entry
from ..read.frame import Frame, frame_origin
from .facts import Facts, tail_entry
from .markup import badge, esc, fmt_rel

__all__ = ["frame_html", "stacks_section"]

MAX_STACKS = 8  # culprits whose stacks are shown
MAX_FRAMES = 40


def _frame_class(fr: Frame) -> str:
    """``torch`` (inside torch), ``lib`` (stdlib, other installed packages, generated code), ``user``."""
    origin = frame_origin(fr.filename)
    return "lib" if origin == "stdlib" else origin


def _short_path(path: str) -> str:
    """Installed and standard-library files without their install prefix (the full path is
    the frame's tooltip)."""
    for marker in ("/site-packages/", "/dist-packages/", "/lib/python3"):
        i = path.find(marker)
        if i > 0:
            return "…" + path[i:]
    return path


def frame_html(fr: Frame) -> str:
    """``file:line in function``: the short path shown, the full one in its tooltip."""
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
        items.append(f'<li class="{" ".join(cls)}">{frame_html(fr)}{tags}</li>')
    more = f'<li class="dim">… {len(frames) - MAX_FRAMES} more frames</li>' if len(frames) > MAX_FRAMES else ""
    return f'<ol class="stack">{"".join(items)}{more}</ol>'


def _stack_entry(f: Facts, c: Culprit) -> tuple[Entry | None, str]:
    """The entry whose stack explains ``c``, and what it is."""
    if c.kind in (CulpritKind.MISMATCH, CulpritKind.NOT_COMPLETED) and c.collective_seq_id is not None:
        e = f.entry_at(c.rank, c.group_name, c.collective_seq_id)
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
    head = (f'<h3 class="now">rank {c.rank}{who} {badge(c.kind)} <span class="dim">· now: where its threads were '
            f"when the incident was raised, {esc(c.now.describe(), 400)}</span></h3>")
    main = c.now.main
    block = f"<h4>{esc(main.name, 120)}</h4>" + _frames_list(main.frames)
    others = "".join(f"<h4>{esc(t.name, 120)}</h4>" + _frames_list(t.frames) for t in c.now.threads[1:])
    if others:
        block += (f'<details class="threads"><summary>{len(c.now.threads) - 1} other thread'
                  f'{"s" if len(c.now.threads) != 2 else ""}</summary>{others}</details>')
    return head + block


def stacks_section(f: Facts) -> str:
    """The Stacks section: the now-capture and the last collective's stack of each culprit."""
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
        head = f'<h3>rank {c.rank} {badge(c.kind)} <span class="dim">· {esc(what, 300)}</span></h3>'
        if e is None or not e.frames:
            out.append(head + '<p class="dim">No stack recorded for this rank.</p>')
            continue
        block = _frames_list(e.frames)
        if c.kind == CulpritKind.MISMATCH and c.collective_seq_id is not None:
            peer_html = '<p class="dim">No peer stack at this sequence number.</p>'
            peers = [w for w in c.waiting_ranks[:16]]
            found = [tail_entry(f.job.dumps.get(w), c.group_name, c.collective_seq_id) for w in peers]
            if not any(found):  # older than the tails: load (at most) two peers' full dumps
                found = [f.entry_at(w, c.group_name, c.collective_seq_id) for w in peers[:2]]
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

