"""The incident as one self-contained HTML page: verdict, timeline, groups, stacks, problems.

``render(job, verdict)`` returns a complete document: CSS, SVG and a little JavaScript are
inline, nothing is fetched (a Content-Security-Policy forbids it), no font is loaded, and
every piece of information is in the HTML itself (JavaScript only adds highlighting and
click details; print CSS lays it out on paper). Everything taken from dumps (file names,
group descs, stack frames, ops) is HTML-escaped. Pure: same input, same bytes; no clock,
no file system (but the package's own CSS and JS files), no torch.

This module assembles the page and its small sections; the big ones have their own
modules (:mod:`.culprits`, :mod:`.groups`, :mod:`.stacks`, :mod:`.timeline`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import os
from importlib import resources

from ..common.files import atomic_write
from ..common.ranks import compress_ranks
from ..diagnosis.job import Job
from ..diagnosis.verdict import Verdict
from ..version import __version__
from .culprits import verdict_section
from .facts import Facts
from .groups import groups_section
from .headline import headline
from .markup import esc
from .stacks import stacks_section
from .timeline import render_timeline
from .trace_section import TraceDelivery, trace_section

__all__ = ["render", "write_report"]

MAX_PROBLEMS = 300


def render(
    job: Job,
    verdict: Verdict,
    *,
    trace: TraceDelivery | None = None,
) -> str:
    """The report as one HTML document (a ``str``; write it as UTF-8).

    ``trace``: the incident's trace and what its export did (from whoever exported it).
    """
    f = Facts.of(job, verdict)
    culprit_text = _culprit_ranks_text(verdict)
    title = f"fr-otel: {headline(verdict.verdict).word.upper()}" + (
        f" — {culprit_text}" if culprit_text else "")
    body = [
        _header(f, culprit_text),
        '<main>',
        verdict_section(f),
        _timeline_section(f),
        groups_section(f),
        stacks_section(f),
        _notes_section(f),
        trace_section(trace),
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


def write_report(path: str | os.PathLike[str], document: str, *, follow_links: bool = False) -> int:
    """Write ``document`` atomically as UTF-8 (see :mod:`fr_otel.common.files`: a symbolic link at
    ``path`` is replaced, unless ``follow_links`` for a path a person named); returns its size in bytes."""
    data = document.encode("utf-8", "replace")
    atomic_write(path, data, follow_links=follow_links)
    return len(data)


# --------------------------------------------------------------------------- header


def _culprit_ranks_text(v: Verdict) -> str:
    ranks = [c.rank for c in v.blamed]
    unknown = [c.rank for c in v.culprits if not c.blamed]
    text = f"culprit rank{'s' if len(ranks) > 1 else ''} {compress_ranks(ranks, limit=16)}" if ranks else ""
    if unknown:
        text += ("; " if text else "") + f"state unknown: rank{'s' if len(unknown) > 1 else ''} " \
            f"{compress_ranks(unknown, limit=16)}"
    return text


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
    word = esc(headline(v.verdict).word.upper())
    who = f'<span class="sep"> — </span><span class="who">{esc(culprit_text)}</span>' if culprit_text else ""
    return (
        '<header class="top"><div class="wrap">'
        '<div class="brand">fr-otel · incident report</div>'
        f'<h1><span class="verdict-word">{word}</span>{who}</h1>'
        f'<p class="meaning">{esc(headline(v.verdict).meaning)}</p>'
        '<dl class="facts">' + "".join(f"<div><dt>{esc(k)}</dt><dd>{esc(val)}</dd></div>" for k, val in facts) +
        f'</dl><nav aria-label="sections">{nav}</nav></div></header>'
    )


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
    return "\n" + resources.files("fr_otel.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


_CSS = _asset("report.css")
_SCRIPT = _asset("report.js")

