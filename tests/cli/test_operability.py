"""What a first real trial tripped over: `fr-otel run` launch safety, the agent's start-up line,
help texts, export error hints and progress bars. Every command runs for real, in a fresh
interpreter (progress under a real pseudo-terminal)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fr_otel.common.progress import DELAY_S
from fr_otel.common.ports import unused_tcp_port

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FR_OTEL_", "OTEL_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _fr_otel(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True,
                          env=env if env is not None else _env(), timeout=timeout)


# ------------------------------------------------------------------------------------------------
# 1. fr-otel run never refuses to launch because of fr-otel's own settings
# ------------------------------------------------------------------------------------------------
HELLO = [sys.executable, "-c", "import os; print('hello', os.environ.get('FR_OTEL_STALL_SECONDS', 'unset'))"]


@pytest.mark.parametrize(("args", "env", "warning", "stall"), [
    ([], {"FR_OTEL_STALL_SECONDS": "abc"}, "FR_OTEL_STALL_SECONDS: expected a positive number of seconds, got 'abc'",
     "unset"),
    (["--stall-seconds", "abc"], {}, "--stall-seconds: expected a positive number of seconds, got 'abc'", "unset"),
    (["--stall-seconds", "abc"], {"FR_OTEL_STALL_SECONDS": "30"}, "--stall-seconds: expected", "30"),
    (["--stall-seconds=7"], {"FR_OTEL_STALL_SECONDS": "abc"}, None, "7"),
    (["--metrics-port", "http"], {"FR_OTEL_HOOKS": "nope"}, "--metrics-port: expected", "unset"),
    (["--protocol", "http/xml"], {}, "--protocol: expected one of grpc, http/protobuf, http/json", "unset"),
    (["--stal-seconds", "5"], {}, "unknown flag --stal-seconds ignored", "unset"),
    (["--stall-seconds"], {}, "--stall-seconds needs a value", "unset"),
    ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, "OTEL_EXPORTER_OTLP_PROTOCOL: expected one of", "unset"),
    ([], {"FR_OTEL_LOG_LEVEL": "loud", "FR_OTEL_ENABLED": "maybe"}, "FR_OTEL_ENABLED: expected true or false", "unset"),
    ([], {"OTEL_EXPORTER_OTLP_TIMEOUT": "abc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"},
     "OTEL_EXPORTER_OTLP_TIMEOUT: expected a number of seconds, got 'abc'; using the default (10 s)", "unset"),
    ([], {"FR_OTEL_STALL_SECONDS": "1e300"}, "FR_OTEL_STALL_SECONDS: '1e300' is out of range (expected 0.1 to 604800 s)",
     "unset"),
    (["--poll-interval", "1e300"], {}, "--poll-interval: '1e300' is out of range (expected 0.01 to 60 s)", "unset"),
], ids=["bad-variable", "bad-flag", "bad-flag-good-variable", "good-flag-bad-variable", "two-bad", "bad-protocol",
        "unknown-flag", "flag-without-value", "bad-otel-variable", "bad-level-and-bool", "bad-otel-timeout",
        "variable-out-of-range", "flag-out-of-range"])
def test_bad_settings_warn_once_and_still_run_the_command(
        args: list[str], env: dict[str, str], warning: str | None, stall: str) -> None:
    """A bad flag or FR_OTEL_*/OTEL_* value is one warning line; the command runs, and gets only
    the valid value (so its ranks do not warn again)."""
    proc = _fr_otel("run", *args, "--", *HELLO, env=_env(**env))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"hello {stall}\n"
    lines = proc.stderr.splitlines()
    if warning is None:
        assert lines == []
    else:
        assert any(warning in line for line in lines), lines
        assert all(line.startswith("fr-otel: ") and line.endswith("(the job starts anyway)") for line in lines)
        assert len(lines) == len(set(lines)) and len(lines) <= 2 and "Traceback" not in proc.stderr
        assert not any("local files instead" in line for line in lines if "OTEL_EXPORTER_OTLP_TIMEOUT" in line)


def test_run_without_a_command_is_the_only_usage_error() -> None:
    """No COMMAND: exit 2 with an example; a help request prints help."""
    proc = _fr_otel("run", "--stall-seconds", "9")
    assert proc.returncode == 2 and "run needs a command after --" in proc.stderr
    assert _fr_otel("run", "--stall-seconds", "abc", "--help").returncode == 0


def test_run_accepts_a_command_without_the_separator() -> None:
    """`fr-otel run --stall-seconds 5 python -c ...` works like the form with --."""
    proc = _fr_otel("run", "--stall-seconds", "5", *HELLO)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "hello 5\n", "")


# ------------------------------------------------------------------------------------------------
# 5. one line at agent start on local rank 0
# ------------------------------------------------------------------------------------------------
ONE_RANK = """
import time, torch.distributed as dist
dist.init_process_group("gloo")
time.sleep(1.5)
dist.destroy_process_group()
print("training ran")
"""


def _one_rank_job(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = _env(**{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                  "MASTER_PORT": str(unused_tcp_port()), "OMP_NUM_THREADS": "1", "FR_OTEL_POLL_INTERVAL": "0.2",
                  "FR_OTEL_METRICS_PORT": "0", "FR_OTEL_METRICS_ADDR": "127.0.0.1",
                  "FR_OTEL_OUT_DIR": str(tmp_path / "out"), **extra})
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK)
    return _fr_otel("run", "--", sys.executable, str(script), env=env)


@pytest.mark.gloo
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the torch extra")
def test_agent_says_once_what_it_serves_and_where_incidents_go(tmp_path: Path) -> None:
    """Local rank 0 logs one start-up line (the address /metrics binds and this host's URL for it,
    dump folder, trace destination) at the default level; FR_OTEL_LOG_LEVEL=warning silences it. A bad variable is reported once, by
    `fr-otel run`, not again by the rank."""
    proc = _one_rank_job(tmp_path, FR_OTEL_STALL_SECONDS="abc", FR_OTEL_METRICS_ADDR="0.0.0.0")
    assert proc.returncode == 0 and "training ran" in proc.stdout, proc.stderr
    agent = [line for line in proc.stderr.splitlines() if line.startswith("fr-otel")]
    assert len(agent) == 2, agent
    assert "FR_OTEL_STALL_SECONDS" in agent[0] and "(the job starts anyway)" in agent[0]
    line = agent[1]
    host = socket.gethostname()
    assert re.match(r"fr-otel\[rank 0\]: agent on \(rank 0 of 1\): /metrics on all interfaces \(0\.0\.0\.0:(\d+)\): "
                    rf"http://{re.escape(host)}:\1/metrics;", line), "the address it binds, and this host's name"
    assert "over 60 s" in line, "the bad value fell back to the default"
    assert f"dumps in {tmp_path / 'out' / 'dumps'}/" in line and f"OTLP JSON in {tmp_path / 'out'}/" in line

    quiet = _one_rank_job(tmp_path, FR_OTEL_LOG_LEVEL="warning")
    assert quiet.returncode == 0 and "training ran" in quiet.stdout, quiet.stderr
    assert "fr-otel" not in quiet.stderr, quiet.stderr


# ------------------------------------------------------------------------------------------------
# 6. help texts: plain text, real metavars, defaults, one protocol set
# ------------------------------------------------------------------------------------------------
def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from fr_otel.cli import _parser

    (sub,) = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


SUBCOMMANDS = sorted(_subparsers())
MARKUP = re.compile(r"``|:(?:func|class|mod|meth|data|attr):|`[^`]+`_|^\s*\.\. |::\s*$|\*\*", re.MULTILINE)


def test_every_subcommand_is_covered() -> None:
    assert SUBCOMMANDS == ["analyze", "demo", "export", "replay", "report", "run", "watch"]


def test_each_command_loads_only_its_own_module_and_the_table_lists_every_one(nvrx: Path) -> None:
    """`fr-otel analyze` imports no other subcommand (they are listed in cli/commands.py), yet an
    option before the command still gets the command's full parser, as before the split."""
    from fr_otel.cli.commands import COMMANDS

    code = ("import sys, io, contextlib; from fr_otel.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['analyze', sys.argv[1], '--json'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('fr_otel.cli.')))")
    out = subprocess.run([sys.executable, "-c", code, str(nvrx / "lock_gil_1st")], capture_output=True,
                         text=True, env=_env(), check=True).stdout
    assert out.strip() == ("['fr_otel.cli._common', 'fr_otel.cli.analyze', 'fr_otel.cli.commands', 'fr_otel.cli.exit_codes', "
                           "'fr_otel.cli.report']")
    assert sorted(c.name for c in COMMANDS) == SUBCOMMANDS
    first = _fr_otel("-q", "analyze", "--help")  # argparse still picks analyze after the stray option
    assert "--json" in first.stdout, first.stdout + first.stderr


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_help_is_plain_text_with_real_metavars_and_defaults(name: str) -> None:
    """`fr-otel NAME --help` (rendered for real) has no reST markup; every flag that takes a value
    names what it takes (no variable names, no dest-derived placeholders) and says its default."""
    proc = _fr_otel(name, "--help")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert not MARKUP.search(text), MARKUP.search(text).group(0)  # type: ignore[union-attr]
    assert "usage: fr-otel " + name in text
    parser = _subparsers()[name]
    assert parser.description, "a description under the usage line"
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        flag = action.option_strings[-1]
        assert action.help, flag
        if action.nargs == 0:  # a switch
            continue
        metavar = action.metavar
        assert metavar or action.choices, f"{flag}: no metavar (argparse would print {action.dest.upper()})"
        assert "OTEL_" not in str(metavar), f"{flag}: a variable name as metavar"
        assert "default" in action.help, f"{flag}: help does not say the default"


def test_run_help_shows_every_default_from_the_options_table() -> None:
    """`fr-otel run --help` prints each agent default from OPTIONS (and DEFAULT_OUT_DIR), so text and code cannot drift."""
    from fr_otel.agent.config import OPTIONS
    from fr_otel.cli.run import _default_text
    from fr_otel.incident.delivery import DEFAULT_OUT_DIR

    text = " ".join(_fr_otel("run", "--help").stdout.split())
    for option in OPTIONS:
        if option.default is not None:
            assert f"default: {_default_text(option.default)}; sets ${option.env}" in text, option.flag
    assert f"(a folder; default: ./{DEFAULT_OUT_DIR}; sets $FR_OTEL_OUT_DIR)" in text
    import fr_otel.agent.config as config

    restated = [line for line in Path(config.__file__).read_text().splitlines()
                if line.startswith("#:") and re.search(r"\(default\b|\bdefault \d", line)]
    assert restated == [], "a comment restates a default that lives in OPTIONS"


def test_the_protocol_set_is_the_same_everywhere() -> None:
    """grpc, http/protobuf and http/json are accepted by every command that exports, and every
    --protocol help states the same default."""
    from fr_otel.otlp.config import PROTOCOLS

    assert PROTOCOLS == ("grpc", "http/protobuf", "http/json")
    for name, parser in _subparsers().items():
        flags = {s: a for a in parser._actions for s in a.option_strings}
        if "--protocol" not in flags:
            continue
        text = _fr_otel(name, "--help").stdout
        assert "{grpc,http/protobuf,http/json}" in text, name
        if name != "run":  # run checks its flags itself (never refusing to launch)
            assert tuple(flags["--protocol"].choices) == PROTOCOLS, name
        assert "default: $OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else grpc" in flags["--protocol"].help, name


def test_replay_help_matches_its_behaviour(tmp_path: Path) -> None:
    """replay's help says an endpoint is required (and replay indeed refuses without one), and
    offers no --out it would ignore."""
    text = " ".join(_fr_otel("replay", "--help").stdout.split())
    assert "Needs an endpoint" in text and "local OTLP JSON Lines file)" not in text and "--out" not in text
    spool = tmp_path / "x.jsonl"
    spool.write_text("")
    proc = _fr_otel("replay", str(spool))
    assert proc.returncode == 2 and "replay needs an endpoint" in proc.stderr


# ------------------------------------------------------------------------------------------------
# 6. export errors say what to do; spool hints are complete commands
# ------------------------------------------------------------------------------------------------
def _export(dumps: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return _fr_otel("export", str(dumps), "--out", str(tmp_path / "out"), "--timeout", "5", *args)


def test_tls_against_a_plaintext_grpc_collector_says_insecure_or_http(nvrx: Path, tmp_path: Path) -> None:
    """host:port without --insecure against a plaintext collector: the error says to add --insecure
    or write http://host:port, and the export gives up at once instead of retrying TLS."""
    from fr_otel.testing.otlp import OtlpGrpcReceiver

    with OtlpGrpcReceiver() as rx:
        proc = _export(nvrx / "lock_gil_1st", tmp_path, "--endpoint", rx.endpoint)
        assert rx.span_count() == 0
    assert proc.returncode == 3, proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("fr-otel: export to")]
    assert "WRONG_VERSION_NUMBER" in line and "gave up" not in line, "a TLS mismatch is not retried"
    assert f"add --insecure (or OTEL_EXPORTER_OTLP_INSECURE=true), or write the endpoint as http://{rx.endpoint}" in line


def test_grpc_log_lines_stay_silent_unless_the_user_asks_for_them(nvrx: Path, tmp_path: Path) -> None:
    """A TLS mismatch prints fr-otel's one line and no raw gRPC C-core log line before it; a
    GRPC_VERBOSITY the user set is honoured; `run` leaves the job's environment without it."""
    from fr_otel.testing.otlp import OtlpGrpcReceiver

    with OtlpGrpcReceiver() as rx:
        quiet = _export(nvrx / "lock_gil_1st", tmp_path, "--endpoint", rx.endpoint)
        loud = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--out", str(tmp_path / "out"), "--timeout", "5",
                        "--endpoint", rx.endpoint, env=_env(GRPC_VERBOSITY="INFO"))
    assert quiet.returncode == loud.returncode == 3
    assert [line for line in quiet.stderr.splitlines() if not line.startswith("fr-otel: ")] == [], quiet.stderr
    assert "ssl_transport_security" in loud.stderr, "the user's own GRPC_VERBOSITY wins"
    child = _fr_otel("run", "--", sys.executable, "-c", "import os; print(os.environ.get('GRPC_VERBOSITY', 'unset'))")
    assert child.returncode == 0 and child.stdout.strip() == "unset", child.stdout


def test_main_called_in_process_leaves_the_environment_as_it_was(
        nvrx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fr_otel.cli.main() run inside another program (a test, a user's script) quiets gRPC only
    while it runs: a job launched later from that process does not inherit GRPC_VERBOSITY."""
    from fr_otel.cli import main

    monkeypatch.delenv("GRPC_VERBOSITY", raising=False)
    assert main(["analyze", str(nvrx / "lock_gil_1st"), "-q"]) == 0
    assert "GRPC_VERBOSITY" not in os.environ
    monkeypatch.setenv("GRPC_VERBOSITY", "DEBUG")
    assert main(["analyze", str(nvrx / "lock_gil_1st"), "-q"]) == 0
    assert os.environ["GRPC_VERBOSITY"] == "DEBUG"


def test_otlp_http_to_a_grpc_port_says_use_grpc_without_retrying(nvrx: Path, tmp_path: Path) -> None:
    """OTLP/HTTP sent to a gRPC receiver: no traceback, one line saying the endpoint does not speak
    HTTP (it answered with HTTP/2 frames) and which command works, given up at once (no 5 retries);
    the suggested protocol then delivers."""
    from fr_otel.testing.otlp import OtlpGrpcReceiver

    with OtlpGrpcReceiver() as rx:
        proc = _export(nvrx / "lock_gil_1st", tmp_path, "--protocol", "http/protobuf",
                       "--endpoint", f"{rx.url}/v1/traces")
        assert proc.returncode == 3, proc.stderr
        assert "Traceback" not in proc.stderr and "timed out" not in proc.stderr, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert "does not speak HTTP/1.1: it answered with HTTP/2 frames" in line and "gave up" not in line, line
        assert f"use --protocol grpc --endpoint {rx.url}," in line, line
        spool = line.split("send it later with ", 1)[1].split()[2]
        replayed = _fr_otel("replay", spool, "--protocol", "grpc", "--endpoint", rx.url)
        assert replayed.returncode == 0 and rx.span_count() > 0, replayed.stderr


def test_grpc_to_an_otlp_http_port_says_use_http_protobuf_without_retrying(nvrx: Path, tmp_path: Path) -> None:
    """gRPC (the default) sent to an OTLP/HTTP receiver: replay says the endpoint does not speak
    gRPC and gives the OTLP/HTTP command, at once (no retries); that command delivers."""
    from fr_otel.testing.otlp import OtlpHttpReceiver

    written = _export(nvrx / "lock_gil_1st", tmp_path)
    assert written.returncode == 0, written.stderr
    (spool,) = (tmp_path / "out").glob("fr-otel-trace-*.jsonl")
    with OtlpHttpReceiver() as rx:
        bare = f"http://{rx.endpoint}"
        proc = _fr_otel("replay", str(spool), "--keep", "--endpoint", bare)
        assert proc.returncode == 3 and rx.span_count() == 0, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert "does not speak gRPC" in line and "gave up" not in line, line
        assert f"use --protocol http/protobuf --endpoint {bare}/v1/traces," in line, line
        fixed = _fr_otel("replay", str(spool), "--protocol", "http/protobuf", "--endpoint", f"{bare}/v1/traces")
        assert fixed.returncode == 0 and rx.span_count() > 0, fixed.stderr


def test_export_warns_about_a_bad_inherited_timeout_or_insecure_and_still_sends(nvrx: Path, tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_TIMEOUT=abc and OTEL_EXPORTER_OTLP_INSECURE=maybe: one warning each, the
    defaults are used and the trace reaches the collector (exit 0); a bad --timeout flag is still exit 2."""
    from fr_otel.testing.otlp import OtlpGrpcReceiver

    bad = {"OTEL_EXPORTER_OTLP_TIMEOUT": "abc", "OTEL_EXPORTER_OTLP_INSECURE": "maybe"}
    with OtlpGrpcReceiver() as rx:
        proc = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--out", str(tmp_path), "--endpoint", rx.url,
                        env=_env(**bad))
        assert proc.returncode == 0 and rx.span_count() > 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "fr-otel: OTEL_EXPORTER_OTLP_TIMEOUT: expected a number of seconds, got 'abc'; using the default (10 s)",
        "fr-otel: OTEL_EXPORTER_OTLP_INSECURE: expected 'true' or 'false', got 'maybe'; using the default "
        "(TLS unless the endpoint is http://)"]
    flag = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--out", str(tmp_path), "--endpoint", "http://c:4317",
                    "--timeout", "-1")
    assert flag.returncode == 2 and "expected a positive" in flag.stderr


def test_https_against_a_plaintext_http_collector_says_http(nvrx: Path, tmp_path: Path) -> None:
    """https:// to a plaintext OTLP/HTTP receiver: the error says to write http://."""
    from fr_otel.testing.otlp import OtlpHttpReceiver

    with OtlpHttpReceiver() as rx:
        url = f"https://{rx.endpoint}/v1/traces"
        proc = _export(nvrx / "lock_gil_1st", tmp_path, "--protocol", "http/protobuf", "--endpoint", url)
    assert proc.returncode == 3
    assert f"write the endpoint as http://{rx.endpoint}/v1/traces" in proc.stderr, proc.stderr


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json"])
def test_http_404_says_v1_traces(nvrx: Path, tmp_path: Path, protocol: str) -> None:
    """An OTLP/HTTP endpoint without /v1/traces (404): the error gives the URL that works, and
    that URL does work."""
    from fr_otel.testing.otlp import OtlpHttpReceiver

    with OtlpHttpReceiver() as rx:
        bare = f"http://{rx.endpoint}"
        proc = _export(nvrx / "lock_gil_1st", tmp_path, "--protocol", protocol, "--endpoint", bare)
        assert proc.returncode == 3 and "HTTP 404" in proc.stderr
        assert f"use --endpoint {bare}/v1/traces (or OTEL_EXPORTER_OTLP_ENDPOINT={bare}" in proc.stderr, proc.stderr
        fixed = _export(nvrx / "lock_gil_1st", tmp_path, "--protocol", protocol, "--endpoint", f"{bare}/v1/traces")
        assert fixed.returncode == 0 and rx.span_count() > 0, fixed.stderr


def test_spool_hint_is_a_complete_command_that_delivers(nvrx: Path, tmp_path: Path) -> None:
    """The collector refuses: the trace is spooled and the hint is a complete `fr-otel replay`
    command (with --endpoint); run as printed once the collector is back, it delivers every span."""
    import shlex

    import grpc

    from fr_otel.testing.otlp import OtlpGrpcReceiver

    with OtlpGrpcReceiver(always_fail=grpc.StatusCode.PERMISSION_DENIED) as rx:
        proc = _export(nvrx / "lock_gil_1st", tmp_path, "--endpoint", rx.endpoint, "--insecure", "--json")
        assert proc.returncode == 3 and rx.span_count() == 0, proc.stderr
        spans = json.loads(proc.stdout)["export"]["spans"]
        command = proc.stderr.split("send it later with ", 1)[1].strip()
        words = shlex.split(command)
        assert words[:2] == ["fr-otel", "replay"] and "--endpoint" in words and "--insecure" in words, command
        rx.fail_always(None)
        replayed = _fr_otel(*words[1:])
        assert replayed.returncode == 0, replayed.stderr
        assert rx.span_count() == spans > 0
    assert not list((tmp_path / "out").glob("fr-otel-spool-*.jsonl")), "delivered spools are removed"


def test_spool_hint_names_headers_without_their_values_and_an_absolute_path(nvrx: Path, tmp_path: Path) -> None:
    """Exported with --headers to a collector that is down, from another folder with a relative --out:
    the replay hint has an absolute spool path and --headers with each header's name and a <value>
    placeholder (never the secret); filled in and run from elsewhere, it delivers with the header."""
    import shlex

    from fr_otel.testing.otlp import OtlpHttpReceiver

    down = f"http://127.0.0.1:{unused_tcp_port()}/v1/traces"
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "fr_otel.cli", "export", str(nvrx / "lock_gil_1st"), "--out", "out",
                           "--timeout", "1", "--protocol", "http/protobuf", "--endpoint", down,
                           "--headers", "authorization=Bearer%20s3cret,x-tenant=t1"],
                          capture_output=True, text=True, env=_env(), timeout=120, cwd=work)
    assert proc.returncode == 3, proc.stderr
    assert "s3cret" not in proc.stderr + proc.stdout and "t1" not in proc.stderr
    words = shlex.split(proc.stderr.split("send it later with ", 1)[1].strip())
    assert Path(words[2]).is_absolute() and Path(words[2]).parent == work / "out", words
    assert words[words.index("--headers") + 1] == "authorization=<value>,x-tenant=<value>", words
    with OtlpHttpReceiver() as rx:
        words[words.index("--endpoint") + 1] = rx.url
        words[words.index("--headers") + 1] = "authorization=Bearer%20s3cret,x-tenant=t1"
        replayed = subprocess.run([sys.executable, "-m", "fr_otel.cli", *words[1:]], capture_output=True, text=True,
                                  env=_env(), timeout=120, cwd=tmp_path)
        assert replayed.returncode == 0 and rx.span_count() > 0, replayed.stderr
        assert rx.received_headers[0]["authorization"] == "Bearer s3cret"


def test_embedded_file_hint_names_an_endpoint_placeholder(nvrx: Path, tmp_path: Path) -> None:
    """No endpoint: the file hint is a replay command with --endpoint (plaintext gRPC URL form)."""
    proc = _export(nvrx / "lock_gil_1st", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"send it on: fr-otel replay \S+\.jsonl --endpoint http://COLLECTOR:4317$", proc.stdout, re.M)


# ------------------------------------------------------------------------------------------------
# 4. progress bars: on a terminal, for work over a second; never in pipes, never on stdout
# ------------------------------------------------------------------------------------------------
BIG_WORLD, BIG_ENTRIES, CULPRIT = 64, 1000, 3


def _write_hang(out: Path, world: int, entries: int) -> Path:
    """A ``world``-rank hang (``entries`` all_reduces per rank, rank 3 one short), built from a real
    NCCL dump's entry shape."""
    import pickle

    template = pickle.loads((REPO / "tests" / "data" / "nvrx-fr-traces" / "lock_gil_1st" / "_dump_0").read_bytes())
    members = str(list(range(world)))
    for rank in range(world):
        n = entries - (rank == CULPRIT)
        rows = [dict(template["entries"][0], record_id=seq, pg_id=0, process_group=("0", "default_pg"),
                     collective_seq_id=seq, p2p_seq_id=0, op_id=seq, profiling_name="nccl:all_reduce",
                     is_p2p=False, time_created_ns=1_700_000_000_000_000_000 + seq * 1_000_000 + rank,
                     state="scheduled" if seq == n and rank != CULPRIT else "completed")
                for seq in range(1, n + 1)]
        status = {"0": {"last_enqueued_collective": n, "last_started_collective": -1,
                        "last_completed_collective": n - (rank != CULPRIT)}}
        doc = dict(template, pg_config={"0": {"name": "0", "desc": "default_pg", "ranks": members}},
                   pg_status=status, entries=rows)
        (out / f"rank_{rank}").write_bytes(pickle.dumps(doc))
    return out


@pytest.fixture(scope="module")
def big_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_hang(tmp_path_factory.mktemp("big-job"), BIG_WORLD, BIG_ENTRIES)


def _under_a_terminal(*args: str, **env: str) -> tuple[int, bytes, bytes]:
    """Run fr-otel with stderr on a real pseudo-terminal (no window size set, as under some
    CI runners) and stdout on a pipe; (status, stdout, what the terminal showed)."""
    import pty

    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "fr_otel.cli", *args], stdout=subprocess.PIPE,
                            stderr=secondary, env=_env(**env))
    os.close(secondary)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    stdout = proc.stdout.read() if proc.stdout else b""
    return proc.wait(timeout=120), stdout, bytes(shown)


#: tqdm's own variable: show the bar at once, so the test does not depend on this machine's speed
#: (the one-second delay itself is tested in-process below).
AT_ONCE = {"TQDM_DELAY": "0"}


def test_progress_bar_on_a_terminal_only_and_json_untouched(big_job: Path) -> None:
    """analyze --json of 64 dumps: on a terminal stderr shows a tqdm bar of files read
    ("reading dumps ... 22/64 [...]"); in a pipe, or with --quiet, stderr stays empty; stdout is
    byte-identical in all three."""
    args = ("analyze", str(big_job), "--json")
    status, tty_stdout, shown = _under_a_terminal(*args, **AT_ONCE)
    assert status == 0, shown.decode(errors="replace")
    text = shown.decode(errors="replace")
    assert "reading dumps" in text and re.search(rf"\| *\d+/{BIG_WORLD} \[", text), text[-500:]
    assert "\r" in text, "a live bar redraws in place"
    piped = _fr_otel(*args, env=_env(**AT_ONCE))
    assert piped.returncode == 0 and piped.stderr == "", piped.stderr
    assert piped.stdout.encode() == tty_stdout
    verdict = json.loads(tty_stdout)
    assert verdict["world_size"] == BIG_WORLD and verdict["ranks_loaded"] == BIG_WORLD
    status, quiet_stdout, quiet_shown = _under_a_terminal(*args, "--quiet", **AT_ONCE)
    assert status == 0 and quiet_shown == b"" and quiet_stdout == tty_stdout


def test_quick_work_shows_no_bar_on_a_terminal(nvrx: Path) -> None:
    """16 small dumps read in milliseconds: no bar, even on a terminal."""
    status, stdout, shown = _under_a_terminal("analyze", str(nvrx / "lock_gil_1st"), "--json")
    assert status == 0 and json.loads(stdout)["ranks_loaded"] == 16
    assert shown == b""


def test_a_bar_appears_only_after_a_second_of_work() -> None:
    """The delay itself: work shorter than DELAY_S draws nothing, longer work draws the bar, and
    the bar is wiped when the step ends."""
    import io

    from fr_otel.common.progress import TerminalProgress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    def work(seconds: float) -> str:
        screen = Terminal()
        with TerminalProgress(stream=screen).task("reading dumps", "files") as update:
            steps = 10
            for i in range(steps):
                time.sleep(seconds / steps)
                update(i + 1, steps)
        return screen.getvalue()

    assert work(DELAY_S * 0.4) == ""
    shown = work(DELAY_S * 1.6)
    assert "reading dumps" in shown and "10/10" in shown and shown.endswith("\r"), shown
    assert TerminalProgress(stream=io.StringIO()).enabled is False, "not a terminal: no bar"


@pytest.mark.parametrize("workers", [1, 2])
def test_reader_reports_files_read_in_process_and_in_parallel(tmp_path: Path, workers: int) -> None:
    """read_dumps calls progress(files done, files) as files are parsed, on both of its paths
    (one process; a pool, for dumps over 16 MiB), ending at every file."""
    from fr_otel.read import reader

    job = _write_hang(tmp_path, 48, 4000)
    size = sum(f.stat().st_size for f in job.iterdir())
    assert size > reader._PARALLEL_MIN_BYTES, "big enough for the parallel path"
    calls: list[tuple[int, int]] = []
    read = reader.read_dumps(job, workers=workers, progress=lambda done, total: calls.append((done, total)))
    assert len(read.dumps) == 48
    assert calls and calls[-1] == (48, 48) and {t for _, t in calls} == {48}
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) > 1


def test_export_shows_files_read_and_spans_sent_on_a_terminal(big_job: Path, tmp_path: Path) -> None:
    """export --json to a real collector: the terminal shows every step's bar (files read, spans
    built per rank, spans encoded, spans sent); stdout is the same JSON as in a pipe."""
    from fr_otel.testing.otlp import OtlpGrpcReceiver

    with OtlpGrpcReceiver() as rx:
        args = ("export", str(big_job), "--endpoint", rx.url, "--out", str(tmp_path), "--json")
        status, tty_stdout, shown = _under_a_terminal(*args, **AT_ONCE)
        text = shown.decode(errors="replace")
        assert status == 0, text[-800:]
        for step in ("reading dumps", "building spans", "encoding spans", "sending spans"):
            assert step in text, f"{step}: {text[-800:]}"
        assert re.search(r"building spans: .*ranks", text), "counted in ranks"
        piped = _fr_otel(*args, env=_env(**AT_ONCE))
        assert piped.returncode == 0 and not re.search(r"reading dumps|building spans|encoding spans|sending spans|\r",
                                                       piped.stderr), piped.stderr
    assert piped.stdout.encode() == tty_stdout
    assert json.loads(tty_stdout)["export"]["status"] == "sent"


def test_report_shows_progress_on_a_terminal_too(big_job: Path, tmp_path: Path) -> None:
    """report reads through the same bar; its own lines still reach the terminal."""
    status, stdout, shown = _under_a_terminal("report", str(big_job), "-o", str(tmp_path / "r.html"), **AT_ONCE)
    text = shown.decode(errors="replace")
    assert status == 0 and "reading dumps" in text and "HTML report written" in text, text[-500:]
    assert (tmp_path / "r.html").stat().st_size > 0 and b"open it:" in stdout


def test_watch_shows_its_steps_on_a_terminal_only(big_job: Path, tmp_path: Path) -> None:
    """watch --once on a terminal draws the bars of its steps (files read, spans built, spans sent)
    besides its log lines; in a pipe its stderr has log lines only."""
    import shutil

    from fr_otel.testing.otlp import OtlpGrpcReceiver

    def watch(folder: Path, terminal: bool) -> tuple[int, str]:
        shutil.copytree(big_job, folder)
        args = ("watch", str(folder), "--once", "--settle", "0", "--poll", "0.05", "--deadline", "0",
                "--world-size", str(BIG_WORLD), "--endpoint", rx.url, "--out", str(tmp_path / "out"))
        if terminal:
            status, _, shown = _under_a_terminal(*args, **AT_ONCE)
            return status, shown.decode(errors="replace")
        proc = _fr_otel(*args, env=_env(**AT_ONCE))
        return proc.returncode, proc.stderr

    with OtlpGrpcReceiver() as rx:
        status, shown = watch(tmp_path / "tty", True)
        assert status == 0 and len(rx.trace_ids()) == 1, shown[-800:]
        for step in ("reading dumps", "building spans", "sending spans"):
            assert step in shown, f"{step}: {shown[-800:]}"
        status, piped = watch(tmp_path / "pipe", False)
        assert status == 0 and len(rx.trace_ids()) == 1, piped[-800:]
    assert "fr-otel watch:" in piped and not re.search(r"reading dumps|building spans|sending spans|\r", piped)


def test_span_building_and_encoding_report_progress_to_the_end() -> None:
    """build_trace calls progress(ranks built, ranks) per rank and encode_chunks(spans encoded,
    spans) per request: both rise to their total (what the bars show)."""
    from fr_otel.diagnosis.analysis import analyze
    from fr_otel.diagnosis.job import build_job
    from fr_otel.otlp.encode import encode_chunks
    from fr_otel.read.reader import read_dumps
    from fr_otel.trace.spans import build_trace
    from fr_otel.trace.options import TraceOptions

    job = build_job(read_dumps(REPO / "tests" / "data" / "nvrx-fr-traces" / "lock_gil_1st"))
    built: list[tuple[int, int]] = []
    trace = build_trace(job, analyze(job), TraceOptions(full=True), progress=lambda d, t: built.append((d, t)))
    assert built == [(i, 16) for i in range(1, 17)]
    encoded: list[tuple[int, int]] = []
    chunks = encode_chunks(trace.spans, 16 * 1024, lambda d, t: encoded.append((d, t)))
    assert len(chunks) > 3 and encoded[-1] == (len(trace.spans), len(trace.spans))
    assert [d for d, _ in encoded] == sorted(d for d, _ in encoded) and len(encoded) >= len(chunks)


def test_export_reports_spans_sent_as_they_go() -> None:
    """The export loop calls progress(spans delivered, spans) after each request it delivers,
    ending at the total (what the bar on a terminal shows)."""
    from fr_otel.otlp.config import resolve_export_config
    from fr_otel.otlp.export import export_spans
    from fr_otel.testing.otlp import OtlpGrpcReceiver
    from fr_otel.testing.spans import synthetic_spans

    calls: list[tuple[int, int]] = []
    spans = synthetic_spans(3000, attribute_bytes=600)
    with OtlpGrpcReceiver() as rx:
        config = resolve_export_config(endpoint=rx.url, environ={}, max_request_bytes=256 * 1024)
        result = export_spans(spans, config, deadline_s=30, spool_dir=None, progress=lambda d, t: calls.append((d, t)))
        assert result.ok and rx.span_count() == 3000
    assert len(calls) == result.requests_sent > 3
    assert [t for _, t in calls] == [3000] * len(calls)
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == 3000


@pytest.mark.parametrize("args", [
    ("analyze", "--straggler-threshold", "nan"), ("analyze", "--straggler-threshold", "-1"),
    ("analyze", "--workers", "-1"), ("export", "--last-n", "-5"), ("export", "--max-spans", "-1"),
    ("export", "--timeout", "inf"), ("watch", "--poll", "0"), ("watch", "--settle", "-1"),
])
def test_nonsense_numbers_in_flags_are_usage_errors(args: tuple[str, ...], tmp_path) -> None:
    """NaN, infinite or negative counts and durations are refused by argparse (exit 2, one reason)."""
    command, *flag = args
    result = subprocess.run([sys.executable, "-m", "fr_otel.cli", command, str(tmp_path), *flag],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and flag[0] in result.stderr and "Traceback" not in result.stderr
