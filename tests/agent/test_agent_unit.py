"""The live agent's parts, without a training job: exposition, settings, bookkeeping, hooks."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from fr_otel.agent.config import DEFAULT_METRICS_PORT, resolve_config
from fr_otel.agent.serve.health import HealthTracker
from fr_otel.agent.serve.metrics import FrCollector
from fr_otel.agent.observe.poller import ProgressTracker, stall_threshold_s
from fr_otel.agent.observe.recorder import GroupInfo, InFlightEntry, scan_entries
from fr_otel.agent.serve.server import port_for, start_metrics_server
from fr_otel.agent.observe.state import GroupStatus, Health, ProcessInfo, Snapshot
from fr_otel.cli.run import BOOTSTRAP_DIR, child_environment
from fr_otel.incident.delivery import OUT_DIR_ENV

NOW_S = 1_700_000_000.0
NOW_NS = int(NOW_S * 1e9)

SNAPSHOT = Snapshot(
    info=ProcessInfo("3", "1", "node07", "2.13.0+cpu", "gloo", "4", "2000"),
    recorder_enabled=True,
    groups=(
        GroupStatus("0", "default_pg", (0, 1, 2, 3), 0, 12, 11, 12, NOW_NS - 42_500_000_000, True, "all_reduce",
                    600_000),
        GroupStatus("1", "tp", (2, 3), 1, 7, 7),
    ),
    health=Health(polls=120, errors=1, export_failures=0, incidents=2, last_poll_s=1_700_000_000.25,
                  last_incident_trace_id="8148d8a67990f3e495f51437477419ba", last_incident_s=1_699_999_990.5),
    step=13,
    step_started_ns=NOW_NS - 2_250_000_000,
    stall_s=8.0,
)


def _registry(snapshot: Snapshot | None = SNAPSHOT) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FrCollector(lambda: snapshot, clock=lambda: NOW_S))
    return registry


GOLDEN_TEXT = """\
# HELP fr_inflight_collective_age_seconds Age of the oldest collective in flight in this process group on this rank (0 when none).
# TYPE fr_inflight_collective_age_seconds gauge
fr_inflight_collective_age_seconds{op="all_reduce",pg_desc="default_pg",pg_name="0",rank="3"} 42.5
fr_inflight_collective_age_seconds{op="",pg_desc="tp",pg_name="1",rank="3"} 0.0
# HELP fr_inflight_collective_timeout_seconds Timeout of that collective (0 when none in flight, or not yet known).
# TYPE fr_inflight_collective_timeout_seconds gauge
fr_inflight_collective_timeout_seconds{op="all_reduce",pg_desc="default_pg",pg_name="0",rank="3"} 600.0
fr_inflight_collective_timeout_seconds{op="",pg_desc="tp",pg_name="1",rank="3"} 0.0
# HELP fr_last_enqueued_seq Sequence number of the last collective this rank enqueued in the group.
# TYPE fr_last_enqueued_seq gauge
fr_last_enqueued_seq{pg_desc="default_pg",pg_name="0",rank="3"} 12.0
fr_last_enqueued_seq{pg_desc="tp",pg_name="1",rank="3"} 7.0
# HELP fr_last_completed_seq Sequence number of the last collective this rank completed in the group.
# TYPE fr_last_completed_seq gauge
fr_last_completed_seq{pg_desc="default_pg",pg_name="0",rank="3"} 11.0
fr_last_completed_seq{pg_desc="tp",pg_name="1",rank="3"} 7.0
# HELP fr_incidents_total Incidents this rank took part in (raised or joined); exemplar: the trace id.
# TYPE fr_incidents_total counter
fr_incidents_total{rank="3"} 2.0
# HELP fr_info The process behind these series.
# TYPE fr_info gauge
fr_info{backend="gloo",host="node07",local_rank="1",rank="3",recorder_capacity="2000",torch_version="2.13.0+cpu",world_size="4"} 1.0
# HELP fr_agent_polls_total Recorder polls done by the fr-otel agent.
# TYPE fr_agent_polls_total counter
fr_agent_polls_total{rank="3"} 120.0
# HELP fr_agent_errors_total Failures inside the agent (each counted, none reaches training).
# TYPE fr_agent_errors_total counter
fr_agent_errors_total{rank="3"} 1.0
# HELP fr_agent_export_failures_total Incident traces not delivered to the collector (spooled to disk).
# TYPE fr_agent_export_failures_total counter
fr_agent_export_failures_total{rank="3"} 0.0
# HELP fr_agent_last_poll_timestamp_seconds When the agent last read the recorder (epoch seconds).
# TYPE fr_agent_last_poll_timestamp_seconds gauge
fr_agent_last_poll_timestamp_seconds{rank="3"} 1.70000000025e+09
# HELP fr_recorder_enabled 1 when the Flight Recorder records (capacity > 0).
# TYPE fr_recorder_enabled gauge
fr_recorder_enabled{rank="3"} 1.0
# HELP fr_training_step The training step this rank is in (optimizer steps counted since the agent started, or fr_otel.step(n)).
# TYPE fr_training_step gauge
fr_training_step{rank="3"} 13.0
# HELP fr_training_step_age_seconds Seconds since this rank's current training step began (keeps growing while the step does not end).
# TYPE fr_training_step_age_seconds gauge
fr_training_step_age_seconds{rank="3"} 2.25
# HELP fr_stall_threshold_seconds The age at which this rank's agent calls an in-flight collective stalled (--stall-seconds).
# TYPE fr_stall_threshold_seconds gauge
fr_stall_threshold_seconds{rank="3"} 8.0
"""


def test_exposition_text_is_the_contract() -> None:
    """The Prometheus text format, byte for byte: names, labels, values computed at scrape time."""
    assert generate_latest(_registry()).decode() == GOLDEN_TEXT


def test_the_abort_age_is_exported_only_where_a_hang_aborts() -> None:
    """fr_abort_after_seconds is there with --on-hang abort (its age), absent otherwise; the stall threshold always."""
    labels = {"rank": "3"}
    assert _registry().get_sample_value("fr_abort_after_seconds", labels) is None
    aborting = _registry(dataclasses.replace(SNAPSHOT, abort_after_s=30.0))
    assert aborting.get_sample_value("fr_abort_after_seconds", labels) == 30.0
    assert aborting.get_sample_value("fr_stall_threshold_seconds", labels) == 8.0


def test_openmetrics_carries_the_trace_id_exemplar() -> None:
    """OpenMetrics output puts the last incident's trace id on fr_incidents_total as an exemplar."""
    text = generate_openmetrics(_registry()).decode()
    assert ('fr_incidents_total{rank="3"} 2.0 # {trace_id="8148d8a67990f3e495f51437477419ba"} 1.0 1699999990.5\n'
            in text)
    assert "# TYPE fr info\n" in text and text.endswith("# EOF\n")
    # Same samples as the text format otherwise, exemplars only where allowed (counters).
    assert text.count(" # {") == 1


def test_age_keeps_growing_between_polls() -> None:
    """The age is computed from the enqueue time at each scrape, not stored by the poller."""
    clock = [NOW_S]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FrCollector(lambda: SNAPSHOT, clock=lambda: clock[0]))
    first = registry.get_sample_value("fr_inflight_collective_age_seconds",
                                      {"rank": "3", "pg_name": "0", "pg_desc": "default_pg", "op": "all_reduce"})
    clock[0] += 7.25
    second = registry.get_sample_value("fr_inflight_collective_age_seconds",
                                       {"rank": "3", "pg_name": "0", "pg_desc": "default_pg", "op": "all_reduce"})
    assert (first, second) == (42.5, 49.75)


def test_nothing_is_served_before_the_process_group_exists() -> None:
    """Before the agent knows its rank the collector yields nothing (no half-labelled series)."""
    assert generate_latest(_registry(None)) == b""


# --------------------------------------------------------------------------- settings


def test_settings_precedence_argument_env_default() -> None:
    """start() arguments beat FR_OTEL_* variables, which beat defaults."""
    env = {"FR_OTEL_POLL_INTERVAL": "0.5", "FR_OTEL_STALL_SECONDS": "30", OUT_DIR_ENV: "/tmp/x"}
    config, problems = resolve_config({"stall_seconds": 7}, environ=env)
    assert problems == []
    assert (config.poll_interval, config.stall_seconds, config.out_dir) == (0.5, 7.0, "/tmp/x")
    assert config.metrics_port == DEFAULT_METRICS_PORT and config.hooks == ("atexit", "excepthook", "sigterm")
    assert config.refine_after_s == 3.5  # min(suspect 5 s, half the 7 s threshold)


def test_bad_settings_fall_back_and_are_reported_not_raised() -> None:
    """A bad argument falls back to the variable, a bad variable to the default; each is one line."""
    env = {"FR_OTEL_POLL_INTERVAL": "soon", "FR_OTEL_METRICS_PORT": "off", "FR_OTEL_STALL_SECONDS": "20"}
    config, problems = resolve_config({"stall_seconds": -1, "hooks": "atexit,bogus", "nonsense": 1}, environ=env)
    assert config.poll_interval == 1.0 and config.stall_seconds == 20.0 and config.metrics_port is None
    assert config.hooks == ("atexit", "excepthook", "sigterm")
    assert len(problems) == 4
    assert any("FR_OTEL_POLL_INTERVAL" in p for p in problems) and any("nonsense" in p for p in problems)


def test_the_config_has_one_field_per_option_with_that_options_default() -> None:
    """AgentConfig is built from OPTIONS: same names in order, each default written once, in the table."""
    import dataclasses

    from fr_otel.agent.config import OPTIONS, AgentConfig

    fields = dataclasses.fields(AgentConfig)
    assert [f.name for f in fields] == [o.name for o in OPTIONS] + ["endpoint", "protocol", "headers",
                                                                     "export_timeout"]
    assert [getattr(AgentConfig(), o.name) for o in OPTIONS] == [o.default for o in OPTIONS]
    assert resolve_config(environ={}) == (AgentConfig(), [])
    assert resolve_config({"export_timeout": "2.5"}, environ={})[0].export_timeout == 2.5
    documented = AgentConfig()  # what README and docs/agent.md promise, written out once more on purpose
    assert (documented.poll_interval, documented.stall_seconds, documented.suspect_seconds,
            documented.metrics_port, documented.incidents) == (1.0, 60.0, 5.0, DEFAULT_METRICS_PORT, True)


def test_port_per_local_rank() -> None:
    """Rank r on a node serves base + LOCAL_RANK; base 0 asks the OS for any port."""
    assert (port_for(9740, 3), port_for(9740, None), port_for(0, 5)) == (9743, 9740, 0)


def test_port_clash_is_a_log_line_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    """A taken port costs this rank its /metrics and one warning; nothing is raised."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="fr_otel.agent"):
            server = start_metrics_server(FrCollector(lambda: SNAPSHOT), port, "127.0.0.1")
    assert server is None
    assert any(f"cannot serve /metrics on 127.0.0.1:{port}" in r.getMessage() for r in caplog.records)


def test_metrics_server_serves_openmetrics_on_request() -> None:
    """The endpoint negotiates OpenMetrics (what Prometheus asks for) and stops cleanly."""
    import urllib.request

    server = start_metrics_server(FrCollector(lambda: SNAPSHOT, clock=lambda: NOW_S), 0, "127.0.0.1")
    assert server is not None
    try:
        req = urllib.request.Request(server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            body = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert '# {trace_id="8148d8a67990f3e495f51437477419ba"}' in body
    finally:
        server.stop()


def test_recorder_that_is_off_is_turned_on_before_the_process_group(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """TORCH_FR_BUFFER_SIZE=0 before any process group: one clear warning, and the recorder is on."""
    from fr_otel.agent.observe.recorder import prepare_recorder

    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")
    with caplog.at_level(logging.WARNING, logger="fr_otel.agent"):
        prepare_recorder(resolve_config(environ={})[0])
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert [r.getMessage() for r in caplog.records] == [
        ("the PyTorch Flight Recorder was OFF (TORCH_FR_BUFFER_SIZE=0): fr-otel turned it on with 2000 entries "
         "(FR_OTEL_ENABLE_RECORDER=false keeps it off)")]


def test_recorder_capacity_setting_sizes_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """FR_OTEL_RECORDER_CAPACITY (or recorder_capacity=) becomes TORCH_FR_BUFFER_SIZE while it still matters."""
    from fr_otel.agent.observe.recorder import prepare_recorder

    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    prepare_recorder(resolve_config({"recorder_capacity": 20000}, environ={})[0])
    assert os.environ["TORCH_FR_BUFFER_SIZE"] == "20000"


# --------------------------------------------------------------------------- bookkeeping


def _entry(slot: int, seq: int, *, retired: bool, created: int = 1, timeout: int = 60_000, name: str = "0") -> dict:
    return {"pg_id": slot, "process_group": (name, "default_pg"), "collective_seq_id": seq, "is_p2p": False,
            "profiling_name": "gloo:all_reduce", "state": "scheduled", "retired": retired,
            "time_created_ns": created, "timeout_ms": timeout}


def test_tracker_stamps_refines_and_corrects_gloo_lag() -> None:
    """First sight stamps the age; a full read makes it exact and fixes a lagging last_completed."""
    t = ProgressTracker()
    t.set_groups((GroupInfo("0", "default_pg", (0, 1), 0), GroupInfo("5", "tp", (0,), 1)))
    s = t.update({0: (10, 9)}, now_ns=1_000)
    assert [(g.name, g.inflight_seq, g.inflight_since_ns, g.exact) for g in s] == [("0", 10, 1_000, False),
                                                                                   ("5", None, None, False)]
    assert (s[1].enqueued, s[1].completed) == (0, 0)  # a member group with no collective yet still reports
    assert not t.needs_refine(2_000_000_000, 5.0) and t.needs_refine(7_000_000_000, 5.0)
    assert t.stalls(100_000_000_000, 60) == []  # never raised on counters alone
    # The full read says #10 is in fact retired (gloo wrote last_completed out of order).
    pending, done, slots = scan_entries([_entry(0, 9, retired=True), _entry(0, 10, retired=True)])
    s = t.apply_refine(pending, done, slots, now_ns=7_000_000_000)
    assert s[0].inflight_seq is None and s[0].completed == 10
    # Then #11 really sticks: exact enqueue time, op and timeout once refined.
    t.update({0: (11, 10)}, now_ns=8_000_000_000)
    pending, done, slots = scan_entries([_entry(0, 11, retired=False, created=7_500_000_000, timeout=20_000)])
    s = t.apply_refine(pending, done, slots, now_ns=13_000_000_000)
    assert (s[0].inflight_seq, s[0].inflight_since_ns, s[0].exact, s[0].op, s[0].timeout_ms) == (
        11, 7_500_000_000, True, "all_reduce", 20_000)
    stalls = t.stalls(17_600_000_000, stall_seconds=60)
    assert len(stalls) == 1 and stalls[0].threshold_s == 10.0  # half of its 20 s timeout


def test_entries_name_recorder_slots() -> None:
    """A full read's entries override the creation-order guess of which slot is which group."""
    t = ProgressTracker()
    t.set_groups((GroupInfo("0", "default_pg", (0, 1), 0), GroupInfo("7", "dp", (0, 1), 1)))
    t.apply_refine({}, {2: 4}, {2: "7"}, now_ns=0)
    s = t.update({0: (3, 3), 2: (4, 4)}, now_ns=0)
    assert [(g.name, g.local_id, g.enqueued) for g in s] == [("0", 0, 3), ("7", 2, 4)]


def test_stall_threshold_is_min_of_setting_and_half_timeout() -> None:
    assert (stall_threshold_s(60, 600_000), stall_threshold_s(60, 30_000), stall_threshold_s(60, None)) == (
        60, 15, 60)


def test_scan_keeps_the_oldest_pending_per_group() -> None:
    pending, done, _ = scan_entries([_entry(0, 3, retired=True), _entry(0, 4, retired=False, created=5),
                                     _entry(0, 5, retired=False, created=9), _entry(1, 2, retired=True, name="1")])
    assert pending == {0: InFlightEntry(0, "0", 4, 5, "all_reduce", 60_000)} and done == {1: 2}


def test_health_guard_counts_and_rate_limits(caplog: pytest.LogCaptureFixture) -> None:
    """An exception inside the agent is a counter and one log line a minute, never raised."""
    health = HealthTracker()
    with caplog.at_level(logging.WARNING, logger="fr_otel.agent"):
        for _ in range(3):
            with health.guard("reading the recorder"):
                raise RuntimeError("boom")
    assert health.snapshot().errors == 3
    assert [r.getMessage() for r in caplog.records] == [
        "agent error in reading the recorder (training is not affected): RuntimeError: boom"]


# --------------------------------------------------------------------------- processes


def _python(code: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_a_started_agent_loads_no_grpc_sdk_or_torch_and_flush_stays_a_function() -> None:
    """start() in a process without torch.distributed loads neither gRPC, the OTel SDK nor torch,
    and fr_otel.agent.flush is still the documented function once the agent's modules are in."""
    proc = _python("""
        import sys, fr_otel, fr_otel.agent
        agent = fr_otel.start(metrics_port="off", hooks="none")
        print(agent is not None, callable(fr_otel.agent.flush), fr_otel.agent.flush("manual", 0.1))
        print(sorted(m for m in ("torch", "grpc", "opentelemetry") if m in sys.modules))
        fr_otel.stop()
    """, env={"FR_OTEL_ENABLED": "true", "FR_OTEL_AGENT_PID": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["True True False", "[]"]


def test_a_poll_loop_that_fails_outside_its_steps_is_a_log_line_and_the_agent_lives_on() -> None:
    """An agent built with a poll interval no clock can wait (1e300 s; the parsers refuse it, a direct
    AgentConfig does not): its poller thread stays alive, the failure is counted and logged once, no traceback."""
    proc = _python("""
        import threading, time, torch.optim
        from fr_otel.agent.config import AgentConfig
        from fr_otel.agent.core import Agent
        from fr_otel.agent.lifecycle import export_config_for
        from fr_otel.agent.logs import configure_logging
        configure_logging("info")
        config = AgentConfig(poll_interval=1e300, metrics_port=None, hooks=(), incidents=False)
        agent = Agent(config, export_config_for(config))
        agent.start()
        time.sleep(1.5)
        print(agent.running, agent.health.snapshot().errors > 0)
        agent.stop()
    """, env={"FR_OTEL_AGENT_PID": ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("agent error in the poll loop") == 1, proc.stderr


def test_the_log_prefix_is_the_same_at_every_level_and_debug_puts_the_time_in_front() -> None:
    """`fr-otel[rank N]: ` at info and at debug alike (the README's grep), the debug line's time before it."""
    for level in ("info", "debug"):
        proc = _python(f"""
            import logging
            from fr_otel.agent.logs import configure_logging, set_log_rank
            configure_logging("{level}")
            set_log_rank(3)
            logging.getLogger("fr_otel.agent").info("incident 1 (stall, raised by rank 3): hang")
        """)
        (line,) = proc.stderr.splitlines()
        stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} " if level == "debug" else ""
        assert re.fullmatch(stamp + r"fr-otel\[rank 3\]: incident 1 \(stall, raised by rank 3\): hang", line), line


def test_signals_after_a_sigterm_the_previous_handler_kept_alive_print_no_broken_pipe() -> None:
    """A SIGTERM whose previous Python handler lets the process live on (Lightning's): the wake-up fd's reader
    keeps reading, so later signals (SIGUSR1 here, SIGTERM again) write to an open pipe and print nothing."""
    proc = _python("""
        import os, signal, time
        from fr_otel.agent.guest.hooks import ExitHooks
        signal.signal(signal.SIGTERM, lambda *a: print("previous handler", flush=True))
        signal.signal(signal.SIGUSR1, lambda *a: None)
        hooks = ExitHooks(("sigterm",), lambda: None, lambda exc: None, lambda: print("flushed", flush=True))
        assert "sigterm-wakeup-fd" in hooks.install()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the watcher thread has read it and flushed
        for sig in (signal.SIGUSR1, signal.SIGUSR1, signal.SIGTERM):
            os.kill(os.getpid(), sig)
            time.sleep(0.1)
        hooks.uninstall()
        print("done", flush=True)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n").count("flushed") == 1 and "done" in proc.stdout, proc.stdout
    assert proc.stderr == "", proc.stderr


HOOK_SCRIPT = """
    import os, signal, sys, time
    from fr_otel.agent.guest.hooks import ExitHooks
    log = lambda what: open(os.environ["OUT"], "a").write(what + "\\n")
    if os.environ.get("PREV") == "python":
        signal.signal(signal.SIGTERM, lambda *a: (log("previous handler"), sys.exit(3)))
    hooks = ExitHooks(("atexit", "excepthook", "sigterm"), lambda: log("exit"),
                      lambda exc: log(f"exception {type(exc).__name__}"), lambda: log("sigterm"))
    print("installed", ",".join(hooks.install()), flush=True)
    if os.environ.get("DO") == "raise":
        raise ValueError("bad step")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    log("survived")
"""


@pytest.mark.parametrize("case", ["raise", "sigterm-default", "sigterm-chained"])
def test_hooks_flush_then_chain(tmp_path: Path, case: str) -> None:
    """Exception: traceback first, then the flush. SIGTERM: flush, then the previous disposition."""
    out = tmp_path / "calls"
    env = {"OUT": str(out), "DO": "raise" if case == "raise" else "kill",
           "PREV": "python" if case == "sigterm-chained" else ""}
    proc = _python(HOOK_SCRIPT, env)
    assert "installed atexit,excepthook,sigterm,sigterm-wakeup-fd" in proc.stdout
    calls = out.read_text().splitlines()
    if case == "raise":
        assert proc.returncode == 1 and "ValueError: bad step" in proc.stderr
        assert calls == ["exception ValueError", "exit"]
    elif case == "sigterm-default":
        assert proc.returncode == -signal.SIGTERM  # still dies of SIGTERM, after the flush
        assert calls == ["sigterm"]
    else:
        assert proc.returncode == 3
        assert calls == ["sigterm", "previous handler", "exit"]


FLUSHING_SCRIPT = """
    import code, os, signal, sys, threading, time
    from fr_otel.agent.guest.hooks import ExitHooks
    log = lambda what: open(os.environ["OUT"], "a").write(what + "\\n")

    def on_exception(exc):
        log("flush begins")
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()  # torchrun tearing the node down
        time.sleep(1.0)
        log("flush done")
    hooks = ExitHooks(("atexit", "excepthook", "sigterm"), lambda: log("exit"), on_exception, lambda: log("sigterm"))
    hooks.install()
    if os.environ.get("DO") == "repl":  # an exception the REPL handles: the process is not leaving
        code.InteractiveInterpreter().runsource("1/0")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        log("survived")
    raise ValueError("bad step")
"""


@pytest.mark.parametrize("case", ["exit-flush", "repl"])
def test_a_sigterm_during_an_exit_flush_waits_for_it_then_ends_the_process(tmp_path: Path, case: str) -> None:
    """torchrun SIGTERMs a node's other workers as soon as one fails: a worker already flushing its own failure
    finishes that flush, then dies of the SIGTERM; a SIGTERM with no exit flush running acts at once."""
    out = tmp_path / "calls"
    proc = _python(FLUSHING_SCRIPT, {"OUT": str(out), "DO": case})
    calls = out.read_text().splitlines()
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    if case == "exit-flush":
        assert calls == ["flush begins", "flush done", "exit"]  # not cut short, and no second (SIGTERM) flush
    else:
        assert calls == ["sigterm"]  # the REPL's handled exception deferred nothing


def test_run_puts_the_bootstrap_first_and_flags_into_the_environment() -> None:
    """`fr-otel run` flags become FR_OTEL_* variables; the bootstrap leads PYTHONPATH."""
    from fr_otel.cli.run import parse_launch

    launch = parse_launch(["--stall-seconds", "9", "--metrics-port", "off", "--", "torchrun", "x.py"])
    env, problems = child_environment(launch.flags, {"PYTHONPATH": "/theirs", "FR_OTEL_AGENT_PID": "1"})
    assert problems == [] and launch.problems == []
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(BOOTSTRAP_DIR)
    assert env["PYTHONPATH"].endswith("/theirs")
    assert (env["FR_OTEL_STALL_SECONDS"], env["FR_OTEL_METRICS_PORT"], env["FR_OTEL_AUTOSTART"]) == ("9", "off", "1")
    assert "FR_OTEL_AGENT_PID" not in env
    assert launch.command == ["torchrun", "x.py"]


def test_bootstrap_chains_the_shadowed_sitecustomize(tmp_path: Path) -> None:
    """The sitecustomize fr-otel puts first still runs the one it shadows; no rank, no agent."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = {"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(theirs)]), "FR_OTEL_AUTOSTART": "1"}
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
        env[name] = ""
    proc = _python("import os, sys; print(os.environ.get('THEIRS_RAN'), 'fr_otel.agent.core' in sys.modules)", env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "False"]


# --------------------------------------------------------------------------- send/recv


def _p2p_entry(slot: int, name: str, *, done: bool, created: int, pg: str = "43") -> dict:
    return {"pg_id": slot, "process_group": (pg, "PIPELINE_MODEL_PARALLEL_GROUP"), "collective_seq_id": 26,
            "p2p_seq_id": 7, "is_p2p": True, "profiling_name": f"nccl:{name}",
            "state": "completed" if done else "scheduled", "retired": done, "time_created_ns": created,
            "timeout_ms": 180_000}


def test_pending_send_recv_become_per_peer_ages_with_global_ranks() -> None:
    """A full read's pending send/recv map local ranks to global ones; the oldest per peer is kept."""
    from fr_otel.agent.observe.recorder import scan_p2p

    entries = [_p2p_entry(6, "send 1->2", done=False, created=5_000_000_000),
               _p2p_entry(6, "send 1->2", done=False, created=6_000_000_000),
               _p2p_entry(6, "recv 1<-0", done=True, created=4_000_000_000),
               _p2p_entry(6, "recv 1<-?", done=False, created=7_000_000_000)]
    t = ProgressTracker()
    t.set_groups((GroupInfo("0", "default_pg", (0, 4, 8, 12), 0),
                  GroupInfo("43", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 4, 8, 12), 6)))
    t.update({0: (3, 3), 6: (13698, 13695)}, now_ns=1)
    pending, done, slots = scan_entries(entries)
    s = t.apply_refine(pending, done, slots, now_ns=2, p2p=scan_p2p(entries))
    pipe = next(g for g in s if g.name == "43")
    assert pipe.has_p2p and [(w.op, w.peer, w.since_ns) for w in pipe.p2p] == [
        ("send", 8, 5_000_000_000), ("recv", None, 7_000_000_000)]
    assert t.update({0: (3, 3), 6: (13698, 13698)}, now_ns=3)[1].p2p == ()  # all done: nothing pending


def test_p2p_groups_expose_peer_ages_and_no_cross_rank_counters() -> None:
    """fr_inflight_p2p_age_seconds names the peer; a p2p group's per-rank counters are not exposed."""
    from fr_otel.agent.observe.state import P2PWait

    snap = Snapshot(
        info=ProcessInfo("4", "0", "node01", "2.13.0", "nccl", "16", "2000"), recorder_enabled=True,
        groups=(GroupStatus("43", "PIPELINE_MODEL_PARALLEL_GROUP", (0, 4, 8, 12), 6, 13698, 13695, 13696,
                            NOW_NS - 1, has_p2p=True,
                            p2p=(P2PWait("send", 8, NOW_NS - 30_000_000_000), P2PWait("recv", None, NOW_NS))),),
    )
    registry = _registry(snap)
    labels = {"rank": "4", "pg_name": "43", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP"}
    assert registry.get_sample_value("fr_inflight_p2p_age_seconds", {**labels, "op": "send", "peer": "8"}) == 30.0
    assert registry.get_sample_value("fr_inflight_p2p_age_seconds", {**labels, "op": "recv", "peer": "any"}) == 0.0
    text = generate_latest(registry).decode()
    assert "fr_last_enqueued_seq{" not in text and "fr_inflight_collective_age_seconds{" not in text


def test_the_poll_thread_stops_looking_for_torch_optim_often_after_start_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that never imports torch.optim costs fast wake-ups only in the start-up window, then one per poll."""
    import time

    from fr_otel.agent import core
    from fr_otel.otlp.config import resolve_export_config

    monkeypatch.delitem(sys.modules, "torch.optim.optimizer", raising=False)
    monkeypatch.setattr(core, "_ARM_WINDOW_S", 0.5)  # from the poll thread's start
    config, _ = resolve_config({"metrics_port": "off", "incidents": False, "hooks": False, "poll_interval": 0.5})
    agent = core.Agent(config, resolve_export_config())
    looks: list[float] = []
    arm = agent._arm_steps
    monkeypatch.setattr(agent, "_arm_steps", lambda: (looks.append(time.monotonic()), arm())[1])
    agent.start()
    try:
        time.sleep(2.6)
    finally:
        agent.stop()
    early = [t for t in looks if t - looks[0] < 0.5]
    late = [t for t in looks if t - looks[0] >= 1.0]  # past the window even if the thread started late
    assert len(early) >= 4, looks  # every 50 ms while steps may start
    assert len(late) <= 5, looks  # then once per 0.5 s poll (the tick looks): ~4 in 1.6 s, not 32
