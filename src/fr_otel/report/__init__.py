"""Renderings for people: the verdict as text and the self-contained HTML incident page.

Imports flow one way, from the page down to the facts:

- :mod:`.text` — the terminal verdict (``render_verdict``, ``step_sentence``);
- :mod:`.html` — the page: ``render`` and ``write_report``; it assembles the sections
  :mod:`.culprits` (cards, with :mod:`.advice` for the next step), :mod:`.groups`,
  :mod:`.stacks`, :mod:`.trace_section` (what became of the trace) and :mod:`.timeline` (SVG
  geometry over the lanes :mod:`.lanes` chose);
- :mod:`.headline` — what each verdict word means, for both renderings;
- :mod:`.facts` — the report's data model and its queries on the job; :mod:`.markup` —
  escaping and formatting; ``assets/`` — the page's CSS and JavaScript (package data).
"""
