"""`fr-otel watch` never writes through links planted in the folder it watches or in --out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.hostile_side_files import small_job

from fr_otel.otlp.config import resolve_export_config
from fr_otel.otlp.export import export_spans
from fr_otel.common.ports import unused_tcp_port
from fr_otel.testing.spans import synthetic_spans
from fr_otel.common.ids import trace_id_for


def test_watch_replaces_every_planted_link_and_keeps_their_targets(tmp_path: Path) -> None:
    """incident.json, incident.html, ranks.json, the state file and the trace file in --out are
    links to files elsewhere: after `watch --once` each name is a regular file fr-otel wrote and
    every target still holds what it held (not overwritten, their modes kept)."""
    folder = small_job(tmp_path / "dumps")
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    trace = f"{trace_id_for('planted', 'watch-1'):032x}"
    planted = {folder / "incident.json": "x", folder / "incident.html": "x", folder / ".fr-otel-watch.json": "x",
               folder / "ranks.json": '{"version": 1, "ranks": {}}', out / f"fr-otel-trace-{trace}.jsonl": "x"}
    victims = {}
    for i, (link, content) in enumerate(planted.items()):
        victim = elsewhere / f"victim{i}"
        victim.write_text(content)
        link.symlink_to(victim)
        victims[link] = victim
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    result = subprocess.run([sys.executable, "-m", "fr_otel.cli", "watch", str(folder), "--once", "--settle", "0",
                             "--deadline", "0", "--poll", "0.1", "--out", str(out), "--job-id", "planted"],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    for link, victim in victims.items():
        assert victim.read_text() == planted[link], link
    for name in ("incident.json", "incident.html", ".fr-otel-watch.json", "ranks.json"):
        assert (folder / name).is_file() and not (folder / name).is_symlink(), name
    written = out / f"fr-otel-trace-{trace}.jsonl"
    assert written.is_file() and not written.is_symlink() and written.stat().st_size > 1000
    assert "was a symbolic link: replaced by a regular file" in result.stderr


def test_a_spool_is_never_appended_through_a_planted_link(tmp_path: Path) -> None:
    """A collector that is down and a link where the spool goes: the spool replaces the link."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    spool_dir = tmp_path / "out"
    spool_dir.mkdir()
    (spool_dir / "spool.jsonl").symlink_to(victim)
    config = resolve_export_config(endpoint=f"127.0.0.1:{unused_tcp_port()}", insecure=True, environ={})
    result = export_spans(synthetic_spans(20), config, deadline_s=2, spool_dir=spool_dir, spool_name="spool.jsonl")
    assert result.spans_spooled == 20 and result.spans_lost == 0
    assert victim.read_text() == "precious\n" and not (spool_dir / "spool.jsonl").is_symlink()
