"""The HTML incident report, rendered and then loaded in a real headless Chromium.

The system browser is driven by Playwright (tests/support/headless_chromium.py), so every claim is
observed, not assumed: console errors and uncaught exceptions, every network request the page
makes (none may leave the file), JavaScript dialogs (an escaping bug would open one),
``document.body.innerText`` (the culprit ranks must be there, with and without JavaScript),
and screenshots, kept under ``$FR_OTEL_TEST_ARTIFACTS/html-report/`` (default: the temporary
folder's ``fr-otel-test-artifacts/``; never the checkout). Inputs
are real: hung gloo jobs run here, the 16-rank NCCL dumps from tests/data/nvrx-fr-traces, and
a 1024-rank job scaled from a real recorded rank by the bench generator.
"""

from __future__ import annotations

import html
import importlib.util
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.report.html import render, write_report
from support.headless_chromium import Chromium, Page, find_chromium

REPO = Path(__file__).resolve().parents[2]
#: Pages and screenshots to look at after a run (CI may keep the folder it names): never in the checkout.
ARTIFACTS = Path(os.environ.get("FR_OTEL_TEST_ARTIFACTS")
                 or Path(tempfile.gettempdir()) / "fr-otel-test-artifacts") / "html-report"
BENCH_GENERATOR = REPO / "bench" / "make_scaled_dumps.py"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="needs the torch extra (real gloo jobs)")

# Everything a page may reference: in-page anchors only.
EXTERNAL_REFS_JS = """
(() => {
  const out = [];
  for (const el of document.querySelectorAll('*')) {
    for (const a of el.attributes) {
      if (/^(src|href|xlink:href|action|formaction|srcset|poster|data|background|ping)$/i.test(a.name)
          && !a.value.startsWith('#')) out.push(el.tagName + ' ' + a.name + '=' + a.value);
    }
  }
  for (const sheet of document.styleSheets) {
    for (const rule of sheet.cssRules) {
      if (/url\\(|@import/i.test(rule.cssText)) out.push('css: ' + rule.cssText.slice(0, 120));
    }
  }
  for (const tag of ['link', 'img', 'iframe', 'object', 'embed', 'video', 'audio', 'source', 'base', 'form']) {
    if (document.getElementsByTagName(tag).length) out.push('element <' + tag + '>');
  }
  return out;
})()
"""


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def browser():
    pytest.importorskip("playwright.sync_api", reason="Playwright drives the browser (the test extra)")
    exe = find_chromium()
    if exe is None:
        pytest.skip("headless Chromium not found (/usr/bin/chromium: Debian's chromium, which "
                    "scripts/setup-system.sh installs)")
    with Chromium.launch(exe) as b:
        yield b


@pytest.fixture(scope="session")
def gloo_dumps(scenario_dumps):
    """A scenario's real hung gloo job (conftest runs each once per session): its pickle dump folder."""
    return lambda name: scenario_dumps(name) / "pickle"


def _render_to(folder: Path, out: Path, **kwargs) -> tuple[Path, object]:
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    write_report(out, render(job, verdict, **kwargs))
    return out, verdict


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


def _check_in_browser(browser: Chromium, path: Path, name: str, ranks: list[int], *, javascript: bool = True) -> Page:
    """Load ``path``; assert a clean load with no request leaving the file and the culprit
    ranks in the rendered text; keep a full-page screenshot."""
    page = browser.open(path, javascript=javascript)
    try:
        assert page.console_errors == [], page.console_errors
        assert page.external_requests == [], page.external_requests
        assert page.requests == [page.url]  # the document itself, nothing else
        assert page.dialogs == []
        assert page.evaluate("performance.getEntriesByType('resource').length") == 0
        assert page.evaluate(EXTERNAL_REFS_JS) == []
        text = page.text()
        for r in ranks:
            assert re.search(rf"\brank {r}\b", text), f"rank {r} not in the rendered text of {path}"
        shot = _artifact(f"{name}.png")
        png = page.screenshot(shot)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        print(f"screenshot: {shot} (page loaded in {page.load_s * 1e3:.0f} ms)")
    except BaseException:
        page.close()
        raise
    return page


# --------------------------------------------------------------------------- pure rendering


def test_render_is_pure_self_contained_and_bounded(nvrx: Path) -> None:
    job = build_job(read_dumps(nvrx / "lock_gil_2nd"))
    verdict = analyze(job)
    first = render(job, verdict)
    assert render(job, verdict) == first  # no clock, no randomness
    assert first.startswith("<!DOCTYPE html>") and first.rstrip().endswith("</html>")
    assert "Content-Security-Policy" in first and "default-src 'none'" in first
    for needle in ("http://", "https://", "<link", "<img", "<iframe", "@import", "url("):
        assert needle not in first, needle
    assert re.findall(r'(?:src|href)="([^"#][^"]*)"', first) == []
    assert "culprit ranks 10,15" in first
    assert 'id="timeline"' in first and "<svg" in first


def test_trace_section_from_export(tmp_path: Path) -> None:
    """What export did (the outcome, in its own words) turns into how to open the trace."""
    from fr_otel.incident.delivery import ExportOutcome
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.otlp.export import ExportResult
    from fr_otel.report.trace_section import trace_section

    tid = "0123456789abcdef0123456789abcdef"
    to = ExportConfig(endpoint="collector:4317", insecure=True)
    sent = trace_section(ExportOutcome("sent", "collector:4317", None, ExportResult(spans_sent=9)).for_page(tid, 9, to))
    assert tid in sent and "Tempo" in sent and "Jaeger" in sent and "sent to collector:4317" in sent
    path = tmp_path / "fr-otel-trace.jsonl"
    file = trace_section(ExportOutcome("file", str(path), path, None).for_page(tid, 9, ExportConfig()))
    assert "Upload" in file and f"written to {path}" in file and f"fr-otel replay {path}" in file
    spooled = ExportOutcome("spooled", "collector:4317", path, ExportResult(spans_spooled=9, spool_path=path,
                                                                            error="connection refused"))
    page = spooled.for_page(tid, 9, to)
    assert page.where == str(path) and page.sentence == spooled.describe(9, to)
    shown = trace_section(page)
    assert 'class="warn"' in shown and "NOT delivered (connection refused)" in shown
    assert "--endpoint collector:4317" in shown  # the replay command names the configured collector
    assert "Not exported" in trace_section(None)


def test_a_partly_delivered_trace_reads_as_partly_delivered_on_the_page(nvrx: Path) -> None:
    """The collector dropped some spans: the page says "only PARTLY delivered", as the CLI does, not "failed"."""
    from fr_otel.incident.delivery import ExportOutcome
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.otlp.export import ExportResult

    config = ExportConfig(endpoint="collector:4317", insecure=True)
    outcome = ExportOutcome("partial", "collector:4317", None,
                            ExportResult(spans_sent=159, spans_rejected=158, error="partial success: 158 rejected"))
    job = build_job(read_dumps(nvrx / "lock_gil_2nd"))
    verdict = analyze(job)
    document = render(job, verdict, trace=outcome.for_page("ab" * 16, 317, config))
    start = document.index('<section id="trace">')
    section = document[start:document.index("</section>", start)]
    said = outcome.describe(317, config)
    assert said.startswith("only PARTLY delivered to collector:4317")
    assert f"The trace was {html.escape(said)}." in section and "Export failed" not in section
    assert "Tempo" in section  # what did arrive can be opened by its id


def test_a_folder_s_report_tells_what_became_of_the_live_incident_s_trace(nvrx: Path, tmp_path: Path) -> None:
    """incident.json records the live export's outcome; `fr-otel report` and `analyze --html` of that
    folder say it (a lost trace is lost, a spooled one gives its replay command), never "exported"
    by default; an incident.json without a readable record says the outcome is not recorded."""
    import json

    from fr_otel.cli import main
    from fr_otel.incident.delivery import ExportOutcome
    from fr_otel.incident.files import INCIDENT_FILE, write_incident_files
    from fr_otel.incident.summary import verdict_summary
    from fr_otel.otlp.config import ExportConfig
    from fr_otel.otlp.export import ExportResult
    from fr_otel.trace.spans import build_trace

    folder = tmp_path / "dumps"
    shutil.copytree(nvrx / "lock_gil_1st", folder)
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    trace = build_trace(job, verdict)
    config = ExportConfig(endpoint="collector:4317", insecure=True)
    spool = tmp_path / "fr-otel-spool.jsonl"
    cases = {
        "failed": ExportOutcome("failed", "collector:4317", None, ExportResult(error="connection refused")),
        "spooled": ExportOutcome("spooled", "collector:4317", spool,
                                 ExportResult(spans_spooled=3, spool_path=spool, error="connection refused")),
    }

    def trace_section_of(page: Path) -> str:
        text = page.read_text(encoding="utf-8")
        start = text.index('<section id="trace">')
        return text[start:text.index("</section>", start)]

    for status, outcome in cases.items():
        write_incident_files(folder, job, verdict, trace, outcome, config, verdict_summary(verdict, trace, outcome, config))
        said = html.escape(outcome.describe(len(trace.spans), config))
        for argv in (["report", str(folder), "-o", str(tmp_path / "r.html")],
                     ["analyze", str(folder), "-q", "--html", str(tmp_path / "r.html")]):
            assert main(argv) == 0
            section = trace_section_of(tmp_path / "r.html")
            assert f"The trace was {said}." in section and 'class="warn"' in section, (status, section)
            assert "Exported when" not in section
        if status == "spooled":
            assert f"<code>{html.escape(f'fr-otel replay {spool}')}" in section
    document = json.loads((folder / INCIDENT_FILE).read_text())
    document["summary"]["export"] = {"status": "sent"}  # no sentence: not a record this version wrote
    (folder / INCIDENT_FILE).write_text(json.dumps(document))
    assert main(["report", str(folder), "-o", str(tmp_path / "r.html")]) == 0
    assert "not recorded" in trace_section_of(tmp_path / "r.html")


def _hostile_copy(src: Path, dest: Path) -> dict[str, str]:
    """The NCCL fixture with hostile strings where dumps hold free text: group descs, stack
    frames, file names, plus an unreadable file whose name lands in the problems list."""
    bad = {
        "desc": '<img src=x onerror="alert(1)">\x07</table>',
        "frame_name": "</script><script>alert(2)</script>",
        "frame_file": '"><svg onload=alert(3)>/train.py',
        "file_prefix": "e\"vil<b>&'_dump_",
    }
    dest.mkdir()
    for f in sorted(src.iterdir()):
        if not f.name.startswith("_dump_"):
            continue
        with open(f, "rb") as fh:
            d = pickle.load(fh)  # the checked-in fixture: trusted test input
        for cfg in d.get("pg_config", {}).values():
            cfg["desc"] = bad["desc"] + cfg["desc"]
        for e in d.get("entries", []):
            name, desc = e["process_group"]
            e["process_group"] = (name, bad["desc"] + desc)
            e["frames"] = [{"name": bad["frame_name"], "filename": bad["frame_file"], "line": 7}]
        rank = f.name.rsplit("_", 1)[1]
        with open(dest / f"{bad['file_prefix']}{rank}", "wb") as fh:
            pickle.dump(d, fh, protocol=2)
    (dest / "<svg onload=alert(4)>_99").write_bytes(b"\x80\x02garbage")
    return bad


def test_hostile_strings_are_escaped(nvrx: Path, tmp_path: Path, browser: Chromium) -> None:
    bad = _hostile_copy(nvrx / "lock_gil_2nd", tmp_path / "hostile")
    out, verdict = _render_to(tmp_path / "hostile", tmp_path / "hostile.html")
    html_text = out.read_text(encoding="utf-8")
    assert [c.rank for c in verdict.culprits] == [10, 15]
    for raw in ("<img src=x", "<script>alert", "<svg onload", "<b>&'", "<svg onload=alert(4)>"):
        assert raw not in html_text, raw
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html_text
    assert "\x07" not in html_text
    page = _check_in_browser(browser, out, "hostile-input", [10, 15])
    try:
        text = page.text()
        # shown, literally; the control character escaped at the reader boundary
        assert bad["desc"].replace("\x07", "\\x07").split("</table>")[0] in text
        assert "alert(4)" in text  # the unreadable file's name, in the problems list, as text
        assert page.evaluate("document.querySelectorAll('script').length") == 1  # ours only
    finally:
        page.close()


# --------------------------------------------------------------------------- real gloo hangs in the browser


@needs_torch
@pytest.mark.gloo
@pytest.mark.parametrize(
    ("scenario", "culprits", "marks"),
    [
        ("skip_allreduce", [2], ["g.bar.focus", "g.bar.ghost"]),  # rank 2 never enqueued #6
        ("subgroup_stall", [3], ["g.bar.focus", "g.bar.ghost"]),
        ("op_mismatch", [1], ["g.bar.mm-odd", "g.bar.mm-peer"]),
    ],
)
def test_gloo_hang_report_in_browser(gloo_dumps, browser: Chromium, tmp_path: Path, scenario: str,
                                     culprits: list[int], marks: list[str]) -> None:
    out, verdict = _render_to(gloo_dumps(scenario), tmp_path / f"{scenario}.html")
    assert [c.rank for c in verdict.culprits] == culprits
    page = _check_in_browser(browser, out, f"gloo-{scenario}", culprits)
    try:
        head = page.evaluate("document.querySelector('h1').innerText")
        assert verdict.verdict.upper() in head and str(culprits[0]) in head
        for selector in marks:  # the stuck collective / the mismatch, marked on the timeline
            assert page.evaluate(f"document.querySelectorAll('#timeline {selector}').length") >= 1, selector
        # Gloo records no completion time: completed bars are drawn as estimated.
        assert page.evaluate("document.querySelectorAll('#timeline g.bar.est').length") >= 1
        # The culprit's stack is there (pickled gloo dumps carry frames): its call site in the job's code.
        stacks = page.evaluate("document.getElementById('stacks').innerText")
        assert "catalog.py" in stacks and "call site" in stacks
        if scenario == "op_mismatch":
            assert "differs" in stacks  # the two call sites, compared
    finally:
        page.close()


@needs_torch
@pytest.mark.gloo
def test_report_readable_without_javascript_and_in_print(gloo_dumps, browser: Chromium, tmp_path: Path) -> None:
    out, _ = _render_to(gloo_dumps("skip_allreduce"), tmp_path / "nojs.html")
    page = _check_in_browser(browser, out, "gloo-skip_allreduce-nojs", [2], javascript=False)
    try:
        assert page.evaluate("document.documentElement.getAttribute('data-js')") is None  # really no JS
        text = page.text().lower()
        for words in ("next step", "timeline", "process groups", "never enqueued #6", "stacks"):
            assert words in text, words
        assert page.evaluate("document.querySelectorAll('#timeline g.bar').length") > 4
    finally:
        page.close()
    page = browser.open(out)
    try:
        page.screenshot(_artifact("gloo-skip_allreduce-print.png"), media="print")
        pdf = page.pdf(_artifact("gloo-skip_allreduce.pdf"))
        assert pdf[:5] == b"%PDF-" and len(pdf) > 10_000
        # beforeprint opened every <details>; nothing is hidden on paper.
        assert page.evaluate("document.querySelectorAll('details:not([open])').length") == 0
        assert page.console_errors == []
    finally:
        page.close()


@needs_torch
@pytest.mark.gloo
def test_timeline_interaction(gloo_dumps, browser: Chromium, tmp_path: Path) -> None:
    """Hovering a bar lights the same collective on every rank; clicking shows its details."""
    out, _ = _render_to(gloo_dumps("skip_allreduce"), tmp_path / "interactive.html")
    page = browser.open(out)
    try:
        lit = page.evaluate("""(() => {
            const bar = document.querySelector('#timeline g.bar.focus:not(.ghost)');
            bar.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
            const n = document.querySelectorAll('#timeline g.bar.hl').length;
            bar.dispatchEvent(new MouseEvent('click', {bubbles: true}));
            const info = document.getElementById('tl-info');
            return [n, info.hidden, info.textContent];
        })()""")
        assert lit[0] >= 3  # ranks 0, 1 and 3 all wait in all_reduce #6
        assert lit[1] is False and "all_reduce #6" in lit[2] and "in flight" in lit[2]
        assert page.console_errors == []
    finally:
        page.close()


# --------------------------------------------------------------------------- real NCCL dumps


@pytest.mark.parametrize("incident", ["gpu_error_1st", "gpu_error_2nd", "lock_gil_1st", "lock_gil_2nd"])
def test_nccl_incident_report_in_browser(nvrx: Path, browser: Chromium, tmp_path: Path, incident: str) -> None:
    out, verdict = _render_to(nvrx / incident, tmp_path / f"{incident}.html")
    ranks = [c.rank for c in verdict.culprits]
    expected = {"gpu_error_1st": [12, 14], "lock_gil_2nd": [10, 15]}
    assert ranks == expected.get(incident, ranks) and ranks
    page = _check_in_browser(browser, out, f"nccl-{incident}", ranks)
    try:
        assert page.evaluate("document.querySelectorAll('#timeline g.bar.focus').length") >= 1
        assert page.evaluate("document.querySelectorAll('#timeline .lane').length") == 16  # one lane per rank
        assert "no Python stacks" in page.evaluate("document.getElementById('stacks').innerText")
    finally:
        page.close()


# --------------------------------------------------------------------------- 1024 ranks


@pytest.fixture(scope="session")
def scaled_1024(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    if not BENCH_GENERATOR.is_file():
        pytest.skip(f"{BENCH_GENERATOR} is not in this checkout")
    if not HAS_TORCH:
        pytest.skip("the bench generator records one real rank with torch")
    spec = importlib.util.spec_from_file_location("fr_otel_bench_make_scaled_dumps", BENCH_GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its worker pool pickles functions by module name
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("scaled")
    manifest = module.generate(1024, 200, root / "r1024", cache_dir=root / "recordings")
    return root / "r1024", manifest


@needs_torch
@pytest.mark.slow
def test_1024_rank_report(scaled_1024, browser: Chromium, tmp_path: Path) -> None:
    folder, manifest = scaled_1024
    culprit = manifest["culprit"]
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    assert [c.rank for c in verdict.culprits] == [culprit]
    t0 = time.perf_counter()
    document = render(job, verdict)
    render_s = time.perf_counter() - t0
    out = tmp_path / "r1024.html"
    size = write_report(out, document)
    print(f"1024 ranks: render {render_s * 1e3:.0f} ms, {size / 1024:.0f} KiB")
    assert render_s < 5.0
    assert size < 3 * 2**20
    page = _check_in_browser(browser, out, "scaled-1024-ranks", [culprit])
    try:
        print(f"1024 ranks: browser load {page.load_s * 1e3:.0f} ms")
        assert page.load_s < 5.0
        lanes = page.evaluate("document.querySelectorAll('#timeline .lane').length")
        summary = page.evaluate("document.querySelectorAll('#timeline .lane-summary').length")
        assert 3 <= lanes <= 40 and summary >= 1  # culprit + sampled waiters expanded, the rest folded
        text = page.text()
        assert re.search(r"\b10\d\d ranks\b", text)  # the folded lane / the big group's summary row
        assert "never enqueued" in text
    finally:
        page.close()


# --------------------------------------------------------------------------- the command line


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    src = str(REPO / "src")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env, check=False)


def test_cli_report_analyze_and_export_write_html(nvrx: Path, tmp_path: Path, browser: Chromium) -> None:
    dumps = str(nvrx / "lock_gil_2nd")
    done = _cli("report", dumps, "-o", "incident.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "HANG — culprit rank(s) 10,15" in done.stdout and "incident.html" in done.stderr
    assert (tmp_path / "incident.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")

    done = _cli("analyze", dumps, "--json", "--html", "a.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("{") and done.stdout.count("\n") == 1  # stdout stays one JSON object
    assert (tmp_path / "a.html").is_file()

    done = _cli("export", dumps, "--out", str(tmp_path / "traces"), "--html", "e.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    trace_id = re.search(r"Trace ([0-9a-f]{32})", done.stdout).group(1)  # type: ignore[union-attr]
    html_text = (tmp_path / "e.html").read_text(encoding="utf-8")
    assert trace_id in html_text and f"fr-otel-trace-{trace_id}.jsonl" in html_text
    page = _check_in_browser(browser, tmp_path / "e.html", "cli-export-lock_gil_2nd", [10, 15])
    try:
        assert trace_id in page.evaluate("document.getElementById('trace').innerText")
    finally:
        page.close()

    done = _cli("report", dumps, "-o", str(tmp_path / "missing" / "x.html"), cwd=tmp_path)
    # A folder that does not exist is a usage error found before any work (exit 2, one line).
    assert done.returncode == 2 and "does not exist" in done.stderr and len(done.stderr.splitlines()) == 1
    done = _cli("report", str(tmp_path / "nothing-here"), cwd=tmp_path)
    assert done.returncode == 2


def test_chromium_driver_sees_requests_errors_and_dialogs(browser: Chromium, tmp_path: Path) -> None:
    """The driver's own evidence works: a page that misbehaves is caught (so a clean report means clean)."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><p>x</p><img src="https://example.invalid/a.png">'
                   '<script>console.error("boom"); alert("hi"); undefinedFunction();</script></body></html>')
    page = browser.open(bad)
    try:
        assert any("example.invalid" in u for u in page.external_requests)
        assert any("boom" in e for e in page.console_errors)
        assert any("undefinedFunction" in e for e in page.console_errors)
        assert page.dialogs == ["hi"]
    finally:
        page.close()
    assert shutil.which(find_chromium() or "") is not None
