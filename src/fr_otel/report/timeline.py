"""The timeline of the HTML report as SVG: time to x, lanes to rows, bars, axis and legend.

Pure geometry over the lanes :mod:`fr_otel.report.lanes` chose: where each bar goes, how
overlapping bars share a lane's sub-rows, how an idle stretch before the dump is cut out
of the axis, and what the ticks say. Everything that comes from a dump goes through
:func:`~fr_otel.report.markup.esc` before it reaches the markup.
"""

from __future__ import annotations

import math

from ..common.text import clip
from ..read.dump import MAX_ESTIMATED_END_NS
from .facts import Facts
from .lanes import Bar, Lane, families, lanes_for
from .markup import esc, fmt_duration, fmt_rel

__all__ = ["render_timeline"]

# Drawing constants (SVG user units; the SVG scales to the page width).
WIDTH = 1200
LABEL_W = 214
PLOT_X0 = LABEL_W + 8
PLOT_X1 = WIDTH - 18
AXIS_H = 34
ROW_H = 15
BAR_H = 11
LANE_PAD = 5
ROW_BUDGET = 1000  # px of lanes before rows per lane are capped harder
GROUP_COLOURS = ("#4c78a8", "#72b7b2", "#54a24b", "#9d7fc9", "#b07aa1", "#79706e", "#88a8c8", "#8cb369")
NEUTRAL_COLOUR = "#6b7f99"


class _Scale:
    """Time to x. When the dump comes long after the last activity, the idle stretch is cut
    out of the axis (a break) so the recent history keeps its width."""

    def __init__(self, lo: int, hi: int, ref: int, ref_label: str = "0") -> None:
        hi = max(hi, lo + 1)
        span = hi - lo
        self.ref = ref
        self.ref_label = ref_label
        self.broken = ref > hi and (ref - hi) > 0.6 * span
        w = PLOT_X1 - PLOT_X0
        if self.broken:
            self.a0 = lo - int(0.02 * span)
            self.a1 = hi + int(0.04 * span)
            self.xa1 = PLOT_X0 + 0.83 * w
            self.xb0 = PLOT_X0 + 0.89 * w
            per_ns = (self.xa1 - PLOT_X0) / (self.a1 - self.a0)
            self.b0 = ref - int((PLOT_X1 - self.xb0) / per_ns)
            if self.b0 <= self.a1:  # the tail would overlap: no break after all
                self.broken = False
        if not self.broken:
            top = max(ref, hi)
            self.a0 = lo - int(0.02 * (top - lo))
            self.a1 = top
            self.xa1 = PLOT_X1

    def x(self, t: int) -> float:
        return min(max(self._x(t), PLOT_X0), PLOT_X1)

    def _x(self, t: int) -> float:
        if not self.broken or t <= self.a1:
            return PLOT_X0 + (t - self.a0) * (self.xa1 - PLOT_X0) / max(self.a1 - self.a0, 1)
        if t >= self.b0:
            return self.xb0 + (t - self.b0) * (PLOT_X1 - self.xb0) / max(self.ref - self.b0, 1)
        return self.xa1 + (t - self.a1) * (self.xb0 - self.xa1) / max(self.b0 - self.a1, 1)

    def ticks(self) -> list[tuple[float, str]]:
        """(x, label) at round offsets from the reference (``−10 min``, ``−7 min 30 s`` …
        ``0 (dump)``). When the window sits far before it (a dump long after the hang), the
        first tick says how far in people's units (``−10 min 0 s``) and the others count on
        from it (``+0.2 ms``), instead of ten-digit labels like ``−600.00075 s``."""
        lo, hi = self.a0, (self.a1 if self.broken else self.ref)
        span_s = max(hi - lo, 1) / 1e9
        raw = span_s / 6
        mag = 10 ** math.floor(math.log10(raw))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
        if raw >= 30:  # minutes and hours in round steps (2 min, 5 min, 1 h), not 200 s
            step = next((m for m in _CLOCK_STEPS_S if m >= raw), step)
        first = math.ceil((lo - self.ref) / 1e9 / step)
        last = math.floor((hi - self.ref) / 1e9 / step)
        biggest = max(abs((lo - self.ref) / 1e9), abs((hi - self.ref) / 1e9))
        out = []
        if biggest / step > 2000:
            unit, factor = _unit(step)
            for k in range(first, last + 1):
                t = self.ref + round(k * step * 1e9)
                if k == first:
                    text = fmt_rel((t - self.ref))
                else:
                    text = "+" + _label((k - first) * step, unit, factor, _decimals(step, factor)).lstrip("+")
                out.append((self.x(t), text))
        else:
            unit, factor = ("ms", 1e3) if biggest < 1 else ("s", 1.0)
            decimals = _decimals(step, factor)
            for k in range(first, last + 1):
                v = k * step
                t = self.ref + round(v * 1e9)
                text = fmt_rel(v * 1e9) if step >= 60 else _label(v, unit, factor, decimals)
                out.append((self.x(t), self.ref_label if k == 0 else text))
        if self.broken:  # none under the break's label; the dump itself is 0
            out = [(x, t) for x, t in out if x < self.xa1 - 34]
            out.append((self.x(self.ref), self.ref_label))
        return out


_CLOCK_STEPS_S = (30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _unit(step_s: float) -> tuple[str, float]:
    if step_s < 1e-3:
        return "µs", 1e6
    if step_s < 1:
        return "ms", 1e3
    return "s", 1.0


def _decimals(step_s: float, factor: float) -> int:
    v = step_s * factor
    decimals = max(0, -math.floor(math.log10(v) + 1e-9))
    if round(v * 10**decimals, 6) % 1:
        decimals += 1
    return decimals


def _label(v_s: float, unit: str, factor: float, decimals: int) -> str:
    sign = "−" if v_s < 0 else "+"
    return f"{sign}{abs(v_s) * factor:.{decimals}f} {unit}"


# --------------------------------------------------------------------------- drawing


def _pack(lane: Lane, scale: _Scale, max_rows: int) -> None:
    """Sub-rows so overlapping bars (ops in flight on several groups) stay visible. The stuck
    collective and mismatches are placed first; what does not fit in ``max_rows`` becomes
    one "+N more" bar on the last row."""
    order = sorted(lane.bars, key=lambda b: (not (b.focus or b.mismatch == "odd"), b.kind == "ghost", b.start))
    placed, rest = _try_pack(order, scale, max_rows)
    if not rest:
        lane.rows = max(1, placed)
        return
    placed, rest = _try_pack(order, scale, max_rows - 1)
    hidden = {id(b) for b in rest}
    lane.bars = [b for b in lane.bars if id(b) not in hidden]
    rest.sort(key=lambda b: b.start)
    ops = list(dict.fromkeys(b.label.split(" #")[0] for b in rest))
    lines = [f"{len(rest)} more on this lane (not enough room to draw them apart):"]
    lines += [b.title.split("\n")[0] + f" · enqueued {_first_rel(b, scale.ref)}" for b in rest[:30]]
    if len(rest) > 30:
        lines.append(f"… and {len(rest) - 30} more")
    lane.bars.append(Bar(
        start=min(b.start for b in rest), end=max(b.end for b in rest),
        kind="open" if all(b.kind == "open" for b in rest) else "done", group="", seq=-1,
        label=f"+{len(rest)} more: " + ", ".join(ops[:4]) + ("…" if len(ops) > 4 else ""),
        title="\n".join(lines), count=len(rest), row=max_rows - 1,
    ))
    lane.rows = max_rows


def _first_rel(b: Bar, ref: int) -> str:
    return fmt_rel(b.start - ref)


def _try_pack(order: list[Bar], scale: _Scale, max_rows: int) -> tuple[int, list[Bar]]:
    rows: list[list[tuple[float, float]]] = []
    rest: list[Bar] = []
    for b in order:
        x0 = scale.x(b.start)
        x1 = max(scale.x(b.end), x0 + 0.5)  # real extent: a bar drawn wider than it is may touch the next
        row = next((i for i, spans in enumerate(rows)
                    if all(x1 <= s0 + 0.5 or x0 >= s1 - 0.5 for s0, s1 in spans)), None)
        if row is None:
            if len(rows) >= max_rows:
                rest.append(b)
                continue
            row = len(rows)
            rows.append([])
        rows[row].append((x0, x1))
        b.row = row
    return len(rows), rest


def _fmt(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _text_fits(text: str, width: float, px: float = 6.1) -> str:
    n = int((width - 6) / px)
    if n < min(len(text), 8):
        return ""
    return clip(text, n)


def render_timeline(f: Facts) -> str:
    """The timeline section's SVG (empty string when the dumps hold no times)."""
    drawn = lanes_for(f)
    if drawn is None or f.ref is None:
        return ""
    start, lanes = drawn
    ref = f.ref
    hi = start
    for lane in lanes:
        for b in lane.bars:
            if b.kind != "ghost":
                hi = max(hi, b.start, b.end if b.kind != "open" else b.start)
    scale = _Scale(start, hi, ref, "0 (dump)" if f.verdict.reference_source == "dump_files" else "0")
    max_rows = max(2, min(7, ROW_BUDGET // max(1, len(lanes)) // ROW_H))
    for lane in lanes:
        _pack(lane, scale, max_rows)

    # Colour by group; groups of one kind (same desc: the 128 "tp" groups) share a colour.
    family = families(f.job)
    colour_keys: list[str] = []
    group_ids: dict[str, int] = {}
    for lane in lanes:
        for b in lane.bars:
            if b.group:
                group_ids.setdefault(b.group, len(group_ids))
                key = family.get(b.group, b.group)
                if key not in colour_keys and b.kind in ("done", "est") and not b.mismatch:
                    colour_keys.append(key)
    by_colour = len(colour_keys) <= len(GROUP_COLOURS)
    colour_of = {g: GROUP_COLOURS[colour_keys.index(family.get(g, g))]
                 if by_colour and family.get(g, g) in colour_keys else NEUTRAL_COLOUR for g in group_ids}

    parts: list[str] = []
    y = AXIS_H
    lane_ys = []
    min_rows = 2 if len(lanes) <= 16 else 1  # room for the label's second line
    for lane in lanes:
        lane.rows = max(lane.rows, min_rows)
        h = lane.rows * ROW_H + 2 * LANE_PAD
        lane_ys.append((y, h))
        y += h
    height = y + 8
    parts.append(
        f'<svg id="timeline" class="timeline" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" role="img" aria-labelledby="tl-title" preserveAspectRatio="xMinYMin meet" '
        f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="11">'
    )
    parts.append(f'<title id="tl-title">Timeline of the last collectives on {len(lanes)} lanes; time relative to the '
                 f'reference (0)</title>')
    # Lane backgrounds.
    for i, (lane, (ly, lh)) in enumerate(zip(lanes, lane_ys)):
        cls = "lane" + (" lane-culprit" if lane.culprit else "") + (" lane-summary" if lane.summary else "") + (
            " lane-alt" if i % 2 else "")
        parts.append(f'<rect class="{cls}" x="0" y="{ly}" width="{WIDTH}" height="{lh}"/>')
    # Break band, grid, ticks.
    if scale.broken:
        bx0, bx1 = scale.xa1 + 2, scale.xb0 - 2
        parts.append(f'<rect class="break" x="{_fmt(bx0)}" y="{AXIS_H - 6}" width="{_fmt(bx1 - bx0)}" '
                     f'height="{height - AXIS_H - 2}"/>')
        gap = ref - scale.a1
        parts.append(f'<text class="break-label" x="{_fmt((bx0 + bx1) / 2)}" y="{AXIS_H - 12}" '
                     f'text-anchor="middle">… {esc(fmt_duration(gap))} …</text>')
        for bx in (bx0, bx1):
            parts.append(f'<path class="break-mark" d="M{_fmt(bx - 3)} {AXIS_H + 2} l6 -10"/>')
    for x, text in scale.ticks():
        parts.append(f'<line class="grid" x1="{_fmt(x)}" x2="{_fmt(x)}" y1="{AXIS_H - 4}" y2="{height - 6}"/>')
        anchor = "end" if x > PLOT_X1 - 30 else "middle"
        parts.append(f'<text class="tick" x="{_fmt(x)}" y="{AXIS_H - 12}" text-anchor="{anchor}">{esc(text)}</text>')
    parts.append(f'<line class="axis" x1="{PLOT_X0}" x2="{PLOT_X1}" y1="{AXIS_H - 4}" y2="{AXIS_H - 4}"/>')
    # The stuck collective: where it was first enqueued.
    main = f.stuck[f.focus] if f.focus is not None else None
    if main is not None and main.since is not None and f.focus is not None:
        fx = scale.x(main.since)
        parts.append(f'<line class="focus-line" x1="{_fmt(fx)}" x2="{_fmt(fx)}" y1="{AXIS_H - 4}" '
                     f'y2="{height - 6}"><title>{esc(main.op or "collective")} #{f.focus[1]} on '
                     f'{esc(f.group_label(f.focus[0]), 120)} first enqueued {esc(fmt_rel(main.since - ref))}</title></line>')
    rx = scale.x(ref)
    parts.append(f'<line class="ref-line" x1="{_fmt(rx)}" x2="{_fmt(rx)}" y1="{AXIS_H - 4}" y2="{height - 6}"/>')

    for lane, (ly, lh) in zip(lanes, lane_ys):
        cls = "ll culprit" if lane.culprit else "ll summary" if lane.summary else "ll"
        sub = lane.sub
        parts.append(f'<g class="lane-label"><title>{esc(lane.title, 600)}</title>')
        if lane.rows > 1:
            note = f'<tspan class="ls" dx="6">{esc(lane.note, 40)}</tspan>' if lane.note else ""
            parts.append(f'<text class="{cls}" x="10" y="{ly + LANE_PAD + 11}">{esc(lane.label, 40)}{note}</text>'
                         f'<text class="ls" x="10" y="{ly + LANE_PAD + 24}">{esc(_text_fits(sub, LABEL_W - 8, 5.4))}</text>')
        else:  # one row: the sub-label goes beside the name, keeping the lane compact
            room = LABEL_W - 16 - 7 * len(lane.label)
            parts.append(f'<text class="{cls}" x="10" y="{ly + LANE_PAD + 11}">{esc(lane.label, 40)}'
                         f'<tspan class="ls" dx="6">{esc(_text_fits(sub, room, 5.4))}</tspan></text>')
        parts.append("</g>")
        if lane.missing:
            parts.append(f'<rect class="nodump" x="{PLOT_X0}" y="{ly + LANE_PAD}" width="{PLOT_X1 - PLOT_X0}" '
                         f'height="{BAR_H}"/><text class="nodump-label" x="{PLOT_X0 + 8}" y="{ly + LANE_PAD + 9}">'
                         f'no dump from {"these ranks" if lane.summary else "this rank"}</text>')
        for b in lane.bars:
            parts.append(_bar_svg(b, scale, ly + LANE_PAD + b.row * ROW_H, colour_of, group_ids))
    parts.append("</svg>")
    kinds = {b.kind for lane in lanes for b in lane.bars}
    legend = _legend(f, [(_colour_label(f, k), GROUP_COLOURS[i]) for i, k in enumerate(colour_keys)]
                     if by_colour else [], kinds, scale, ref)
    return "".join(parts) + legend


def _colour_label(f: Facts, key: str) -> str:
    if key.startswith("desc:"):
        desc = key[5:]
        n = sum(1 for g in f.job.groups.values() if g.desc == desc)
        return f"{desc} ({n} groups)"
    return f.group_label(key)


def _bar_svg(b: Bar, scale: _Scale, y: float, colour_of: dict[str, str], group_ids: dict[str, int]) -> str:
    x0 = scale.x(b.start)
    x1 = max(scale.x(b.end), x0 + 2)
    w = x1 - x0
    cls = ["bar", b.kind]
    if b.focus:
        cls.append("focus")
    if b.mismatch:
        cls.append("mm-" + b.mismatch)
    if b.count:
        cls.append("agg")
    colour = ""
    if b.kind in ("done", "est") and not b.mismatch:
        c = colour_of.get(b.group, NEUTRAL_COLOUR)
        colour = f' fill="{c}"'
    key = f"{group_ids[b.group]}:{b.seq}" if b.group in group_ids and b.seq >= 0 else ""
    out = [f'<g class="{" ".join(cls)}" data-k="{key}" tabindex="0"><title>{esc(b.title, 900)}</title>']
    out.append(f'<rect x="{_fmt(x0)}" y="{_fmt(y)}" width="{_fmt(w)}" height="{BAR_H}" rx="2"{colour}/>')
    if b.kind == "open":
        out.append(f'<path class="arrow" d="M{_fmt(x1)} {_fmt(y - 1)} l5 {(BAR_H + 2) / 2:g} l-5 {(BAR_H + 2) / 2:g}z"/>')
    if b.clipped:
        out.append(f'<path class="clip-mark" d="M{_fmt(x0 + 5)} {_fmt(y + 1)} l-4 {BAR_H / 2 - 1:g} l4 {BAR_H / 2 - 1:g}"/>')
    label = b.label
    if b.mismatch == "odd":
        label = "≠ " + label
    text = _text_fits(label, w)
    if text:
        out.append(f'<text class="bl" x="{_fmt(x0 + 4)}" y="{_fmt(y + BAR_H - 2.5)}">{esc(text)}</text>')
    elif (b.focus or b.mismatch == "odd") and x0 - PLOT_X0 > 6.1 * len(label) + 8:
        # Too narrow to hold its name, and it matters: the name goes to its left.
        out.append(f'<text class="bl outside" x="{_fmt(x0 - 4)}" y="{_fmt(y + BAR_H - 2.5)}" '
                   f'text-anchor="end">{esc(label)}</text>')
    out.append("</g>")
    return "".join(out)


def _legend(f: Facts, colours: list[tuple[str, str]], kinds: set[str], scale: _Scale, ref: int) -> str:
    items = []

    def swatch(cls: str, text: str, fill: str = "") -> None:
        fill_attr = f' fill="{fill}"' if fill else ""
        items.append(f'<span class="lg"><svg width="22" height="12" aria-hidden="true"><g class="bar {cls}">'
                     f'<rect x="1" y="1" width="20" height="10" rx="2"{fill_attr}/></g></svg>{text}</span>')

    if colours:
        for text, colour in colours:
            swatch("done", esc(text, 60), colour)
    elif "done" in kinds or "est" in kinds:
        swatch("done", "done", NEUTRAL_COLOUR)
    if "est" in kinds:
        swatch("est", "end estimated (no completion time recorded: the next enqueue, at most "
               f"{fmt_duration(MAX_ESTIMATED_END_NS)})", NEUTRAL_COLOUR)
    if "open" in kinds:
        swatch("open", "in flight at the reference time (never completed)")
    if f.stuck:
        swatch("open focus", "the collective the job is stuck in (red outline)")
    if any(info.not_entered for info in f.stuck.values()):
        swatch("ghost focus", "never enqueued it")
    if f.mismatch_at:
        swatch("done mm-odd", "mismatch: the minority's call")
    where = {"dump_files": "when the dumps were written (file times)",
             "latest_activity": "the newest activity recorded in any dump"}.get(f.verdict.reference_source, "")
    note = f"Time 0 = {where}." if where else "Time 0 = the reference time."
    if scale.broken:
        note += f" The axis skips {esc(fmt_duration(ref - scale.a1))} of inactivity."
    note += " Times are each host's wall clock. Hover a bar for details; the same collective lights up on every lane."
    return f'<div class="legend">{"".join(items)}</div><p class="legend-note">{note}</p>'

