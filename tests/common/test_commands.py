"""Commands people paste are shell-safe, and print no secrets."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

from support.hostile_side_files import INJECTED_HOST, small_job

from fr_otel.common.commands import (
    py_spy_command_line,
    replay_command_line,
    shown_endpoint,
)
from fr_otel.common.names import host_name
from fr_otel.read.discovery import host_from_name


def run_pasted(command: str, tmp_path: Path) -> list[str]:
    """Run ``command`` as an operator pasting it would (``sh -c``), with ``ssh``, ``py-spy`` and
    ``fr-otel`` replaced by stubs that print their arguments one per line; those lines."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name in ("ssh", "py-spy", "fr-otel"):
        stub = stubs / name
        stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
        stub.chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin"}
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, env=env, timeout=10, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_a_host_with_a_command_substitution_is_not_a_host_name() -> None:
    """One pattern decides (letters, digits, '.', '-', '_'): a payload, a space or a newline is no host."""
    for bad in (INJECTED_HOST.format(marker="x"), "node7;id", "node7\n", "-oProxyCommand=x", "a b", "", "é"):
        assert host_name(bad) is None, bad
    for good in ("node7", "gpu-017.cluster.example", "worker_3", "10.0.0.7"):
        assert host_name(good) == good


def test_the_py_spy_command_keeps_a_hostile_host_one_word(tmp_path: Path) -> None:
    """Even a host that slipped past the pattern is one quoted word: pasting runs no payload."""
    marker = tmp_path / "PWNED"
    payload = INJECTED_HOST.format(marker=marker)
    args = run_pasted(py_spy_command_line("dump", 4242, payload), tmp_path)
    assert args == [payload, "py-spy", "dump", "--pid", "4242"] and not marker.exists()


def test_the_report_next_step_runs_no_payload_from_a_side_file(tmp_path: Path, run_cli) -> None:
    """A host `node7 $(touch …/PWNED)` in ranks.json (the one side file that says where ranks ran): every
    command on the report's page, pasted into a shell, leaves no PWNED file (the host is read as unknown)."""
    marker = tmp_path / "PWNED"
    folder = small_job(tmp_path / "dumps")
    rank = {"host": INJECTED_HOST.format(marker=marker), "pid": 4243}
    (folder / "ranks.json").write_text(json.dumps({"version": 1, "ranks": {"3": rank}}))
    out = tmp_path / "incident.html"
    result = run_cli("report", str(folder), "-o", str(out))
    assert result.returncode == 0, result.stderr
    commands = [html.unescape(c) for c in re.findall(r"<code>([^<]*py-spy[^<]*)</code>", out.read_text())]
    assert commands
    for command in commands:
        run_pasted(command, tmp_path)
    assert not marker.exists()
    assert "py-spy dump --pid 4243" in commands


def test_a_torchcomms_dump_name_carries_no_host() -> None:
    """`torchcomm_fr_trace_<rank>` is prefix and rank; a prefix alone is never a host."""
    for name in ("torchcomm_fr_trace_3", "torchcomms_fr_trace_3.json", "/x/torchcomm_fr_trace_12", "mytrace_3",
                 "job42_7"):
        assert host_from_name(name) is None, name
    assert host_from_name("torchcomm_fr_trace_node04_3") == "node04"


def test_torchcomms_ranks_are_not_reported_as_one_node(tmp_path: Path) -> None:
    """Two culprits in torchcomms-named dumps: no 'torchcomm: ranks …' node and no host on them."""
    from fr_otel import analyze, build_job, read_dumps
    from fr_otel.testing.dump_builder import DumpBuilder

    b = DumpBuilder(4)
    world = b.group("0", "default_pg", range(4))
    for _ in range(3):
        b.collective(world)
    b.collective(world, ranks=[0, 1], done=False)
    folder = b.write(tmp_path / "d", prefix="torchcomm_fr_trace_")
    verdict = analyze(build_job(read_dumps(folder)))
    assert {c.rank for c in verdict.culprits} == {2, 3}
    assert all(h != "torchcomm" for h, _ in verdict.nodes)
    assert all(c.host is None for c in verdict.culprits)


def test_query_string_secrets_are_masked_like_header_values(tmp_path: Path) -> None:
    """`?api_key=s3cret&x` prints as `?api_key=<value>&<value>`; the replay command stays one word per
    argument and carries neither secret."""
    url = "https://otel.example:4318/v1/traces?api_key=s3cret&tok"
    assert shown_endpoint(url) == "https://otel.example:4318/v1/traces?api_key=<value>&<value>"
    assert shown_endpoint("http://otel:4318/v1/traces") == "http://otel:4318/v1/traces"
    command = replay_command_line(tmp_path / "spool $(x).jsonl", endpoint=url, protocol="http/protobuf",
                                  header_names=["authorization"])
    assert "s3cret" not in command and "tok" not in command.replace("traces", "")
    assert run_pasted(command, tmp_path) == [
        "replay", str(tmp_path / "spool $(x).jsonl"), "--endpoint",
        "https://otel.example:4318/v1/traces?api_key=<value>&<value>", "--protocol", "http/protobuf", "--headers",
        "authorization=<value>"]


def test_an_endpoint_token_reaches_no_line_page_or_log_of_a_failed_export(tmp_path: Path, run_cli) -> None:
    """A collector that is down, an endpoint with ?api_key=…: the printed line, the replay command,
    the HTML report and the JSON output never hold the token."""
    from fr_otel.common.ports import unused_tcp_port

    folder = small_job(tmp_path / "dumps")
    url = f"http://127.0.0.1:{unused_tcp_port()}/v1/traces?api_key=s3cret-TOKEN"
    page = tmp_path / "incident.html"
    result = run_cli("export", str(folder), "--endpoint", url, "--protocol", "http/protobuf", "--timeout", "1",
                     "--out", str(tmp_path / "out"), "--html", str(page))
    assert result.returncode == 3, result.stderr
    assert "api_key=<value>" in result.stderr
    assert "s3cret" not in result.stdout + result.stderr and "s3cret" not in page.read_text()
    assert os.listdir(tmp_path / "out")
