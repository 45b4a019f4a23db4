"""The human-readable verdict: the answer first, short enough to read at 1000 ranks."""

from __future__ import annotations

from dataclasses import replace

from ..common.ranks import compress_ranks
from ..common.text import one_line, printable
from ..diagnosis.hosts import LOST_STATES
from ..diagnosis.kinds import VerdictWord
from ..diagnosis.verdict import UNKNOWN_STALL, Culprit, Verdict
from ..read.dump import op_name
from .advice import as_lines, as_text, general_next_step, next_step
from .action import action_lines
from .headline import headline
from .markup import fmt_duration

__all__ = ["render_verdict", "step_sentence", "verdict_line"]

MAX_CULPRITS = 12
MAX_GROUP_LINES = 10
MAX_PROBLEMS = 15
MAX_RELATED = 3
#: Where whatever the terminal leaves out is listed in full.
ELSEWHERE = "all in --json and the HTML report (fr-otel report DIR -o incident.html)"


def verdict_line(v: Verdict) -> str:
    """The verdict in one terminal line: ``HANG — culprit rank(s) 2`` (with the gloss and any
    incomplete evidence); the text verdict opens with it and ``fr-otel report`` prints it."""
    head = headline(v.verdict).terminal
    if v.incomplete is not None:
        head += f" (evidence incomplete: {v.incomplete.dumps_present} of {v.incomplete.world_size} dumps)"
    if v.blamed:
        head += f" — culprit rank(s) {compress_ranks(c.rank for c in v.blamed)}"
    gone = [h for h in v.hosts if h.state in LOST_STATES]
    if gone:
        head += f"; {', '.join(f'{h.host} {LOST_STATES[h.state]}' for h in gone[:4])}"
    unknown = [c.rank for c in v.culprits if not c.blamed]
    if unknown:
        head += f"; state unknown: rank(s) {compress_ranks(unknown)}"
    return head


def render_verdict(v: Verdict) -> str:
    """Verdict, culprits with evidence, what is in flight, notes, problems (each bounded)."""
    lines: list[str] = []
    loaded = f"{v.ranks_loaded} of {v.world_size}" if v.world_size else str(v.ranks_loaded)
    backend = "/".join(v.backends) or "unknown backend"
    lines.append(f"fr-otel: {verdict_line(v)}")
    lines.append(f"  {loaded} ranks loaded ({backend})")
    for h in [h for h in v.hosts if h.state in LOST_STATES][:MAX_GROUP_LINES]:
        lines.append(f"  {h.sentence()}")
    if v.stop_order is not None:
        lines.extend(f"  {line}" for line in v.stop_order.lines())
    for host, ranks in v.nodes[:MAX_GROUP_LINES]:
        lines.append(f"  {host}: ranks {compress_ranks(ranks)} — look at the node")
    advised: dict[str, int] = {}  # a step already printed (the rank left out) -> the rank it was printed for
    for c in v.culprits[:MAX_CULPRITS]:
        lines.extend(_culprit_lines(v, c, advised))
    if len(v.culprits) > MAX_CULPRITS:
        rest = v.culprits[MAX_CULPRITS:]
        kinds = sorted({c.kind for c in rest})
        lines.append(f"  … and {len(rest)} more culprit(s): ranks {compress_ranks(c.rank for c in rest)} "
                     f"({', '.join(kinds)}); {ELSEWHERE}")
    if not v.culprits and v.verdict != VerdictWord.HEALTHY:
        lines.extend(_next_lines("  ", as_lines(general_next_step(v))))
    if v.waiting:
        lines.append("")
        lines.append("Waiting (stuck only behind the culprits):")
        lines.extend(f"  {w.sentence()}" for w in v.waiting[:MAX_GROUP_LINES])
        if len(v.waiting) > MAX_GROUP_LINES:
            lines.append(f"  … {len(v.waiting) - MAX_GROUP_LINES} more; {ELSEWHERE}")
    lines.extend(_in_flight_lines(v))
    lines.extend(action_lines(v))
    if v.notes:
        lines.append("")
        lines.append("Notes:")
        lines.extend(f"  - {n}" for n in v.notes)
    if v.problems:
        lines.append("")
        lines.append(f"Problems reading the dumps ({len(v.problems)}):")
        lines.extend(f"  - {one_line(printable(p), 500)}" for p in v.problems[:MAX_PROBLEMS])
        if len(v.problems) > MAX_PROBLEMS:
            lines.append(f"  … {len(v.problems) - MAX_PROBLEMS} more; {ELSEWHERE}")
    # File names and dump text reach the terminal: no control character may (a newline could forge a line).
    return "\n".join(map(printable, lines)) + "\n"


def _in_flight_lines(v: Verdict) -> list[str]:
    """Each group's oldest collective in flight, where peers wait first; with how long it had been
    in flight when dumped, or once that this is unknown (:data:`UNKNOWN_STALL`)."""
    stuck = [g for g in v.groups if g.in_flight is not None]
    if not stuck:
        return []
    undated = not v.dated and any(g.in_flight.since_ns for g in stuck if g.in_flight)
    lines = ["", f"In flight ({len(stuck)} of {len(v.groups)} groups; oldest collective each)"
                 + (f" — {UNKNOWN_STALL}:" if undated else ":")]
    # Groups where someone has not even entered come first: that is where peers wait.
    stuck.sort(key=lambda g: (not g.in_flight.not_entered, g.in_flight.since_ns or 0) if g.in_flight else (True, 0))
    for g in stuck[:MAX_GROUP_LINES]:
        f = g.in_flight
        assert f is not None
        age = v.age_ns(f.since_ns)
        missing = f"; not entered: {compress_ranks(f.not_entered)}" if f.not_entered else ""
        if f.unknown:
            missing += f"; state unknown (no dump or no record): {compress_ranks(f.unknown)}"
        step = f", step {f.step}" if f.step is not None else ""
        when = f"; in flight {fmt_duration(age)} when dumped" if age is not None else ""
        lines.append(f"  {g.group.label}: {f.op or 'collective'} #{f.seq}{step}, entered by {compress_ranks(f.entered)}"
                     f"{missing}{when}")
    if len(stuck) > MAX_GROUP_LINES:
        lines.append(f"  … {len(stuck) - MAX_GROUP_LINES} more group(s); {ELSEWHERE}")
    return lines


MAX_CAUSE_LINES = 4


def _culprit_lines(v: Verdict, c: Culprit, advised: dict[str, int]) -> list[str]:
    host = f" (host {c.host}{f', node {c.node}' if c.node and c.node != c.host else ''})" if c.host else ""
    out = ["", f"  rank {c.rank}{host}: {c.kind} on {c.where}", f"    {c.evidence}"]
    if c.cause is not None and c.cause.said:
        label = c.cause.info.label
        out.append(f"    cause: {label}" + (f" ({c.cause.cls})" if label != c.cause.cls else "") + f" [{c.cause.domain}]")
        out.extend(f"      - {line}" for line in c.cause.evidence[:MAX_CAUSE_LINES])
    if c.step is not None or c.collective_step is not None:
        out.append(f"    {step_sentence(c, v.steps)}")
    for e in c.related[:MAX_RELATED]:
        out.append(f"    also {e.kind} on {e.where}" + (f", waited on by {compress_ranks(e.waiting)}" if e.waiting else ""))
    if len(c.related) > MAX_RELATED:
        out.append(f"    … and {len(c.related) - MAX_RELATED} more group(s); {ELSEWHERE}")
    if c.last_frame is not None:
        f = c.last_frame
        out.append(f"    its last collective was called from {f.filename}:{f.line} in {f.name}")
    # The same step for another rank (only the rank differs) is said once.
    same = as_text(next_step(v, replace(c, rank=-1)))
    if same in advised:
        out.append(f"    next: as for rank {advised[same]}")
    else:
        advised[same] = c.rank
        out.extend(_next_lines("    ", as_lines(next_step(v, c))))
    return out


def _next_lines(indent: str, sentences: list[str]) -> list[str]:
    """``next: First sentence.`` and the others under it, one a line."""
    return [f"{indent}next: {sentences[0]}", *(f"{indent}      {s}" for s in sentences[1:])]


def step_sentence(c: Culprit, steps: dict[int, int] | None = None) -> str:
    """``all_reduce #26 belongs to step 13; rank 2 is still in step 12; ranks 0-1,3 waiting on it
    are in step 13`` (the parts known; ``steps``: rank -> its step)."""
    parts = []
    if c.collective_step is not None and c.collective_seq_id is not None:
        parts.append(f"{op_name(c.op) if c.op else 'collective'} #{c.collective_seq_id} belongs to "
                     f"step {c.collective_step}")
    if c.step is not None:
        parts.append(f"rank {c.rank} is {'still ' if c.collective_step is not None else ''}in step {c.step}")
    by_step: dict[int, list[int]] = {}
    for r in c.waiting_ranks:
        if steps and r in steps:
            by_step.setdefault(steps[r], []).append(r)
    for s, ranks in sorted(by_step.items())[:3]:
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {compress_ranks(ranks)} waiting on it "
                     f"{'are' if len(ranks) > 1 else 'is'} in step {s}")
    return "; ".join(parts) or "training step unknown"
