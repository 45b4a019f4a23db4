"""The agent's settings: one typed dataclass for the values, one table for how each is set."""

from __future__ import annotations

import typing
from dataclasses import fields

from fr_otel.agent.config import OPTIONS, AgentConfig


def test_every_option_is_a_typed_config_field_and_every_field_but_the_otlp_overrides_an_option() -> None:
    """A new setting needs its row and its field; the field's type is what the row's parser returns."""
    hints = typing.get_type_hints(AgentConfig)
    names = [f.name for f in fields(AgentConfig)]
    assert names[: len(OPTIONS)] == [o.name for o in OPTIONS]
    assert names[len(OPTIONS):] == ["endpoint", "protocol", "headers", "export_timeout"]
    for option in OPTIONS:
        assert typing.get_type_hints(option.parse)["return"] == hints[option.name], option.name


def test_a_number_outside_its_range_is_one_problem_line_and_the_default() -> None:
    """Every numeric setting has a range: past its top (``1e300`` seconds, a port of 70000), or below its
    bottom, the variable is refused with a line naming it and its range, and the default is used."""
    from fr_otel.agent.config import resolve_config

    numeric = [o for o in OPTIONS if o.bounds is not None]
    assert {o.name for o in numeric} >= {"poll_interval", "stall_seconds", "suspect_seconds", "wait_sample_interval",
                                         "gather_seconds", "flush_timeout", "max_incidents", "incident_entries",
                                         "pg_warn_seconds", "recorder_capacity", "metrics_port"}
    for option in numeric:
        low, high = option.bounds or (0, 0)
        for value in (f"{high * 10 + 1:g}", "1e300", *([f"{low / 10:g}"] if low > 0 else [])):
            config, problems = resolve_config(environ={option.env: value})
            assert getattr(config, option.name) == option.default, (option.env, value)
            assert len(problems) == 1 and problems[0].startswith(f"{option.env}: "), problems
            assert option.allowed.split(",")[0] in problems[0] or "expected" in problems[0], problems
        assert resolve_config(environ={option.env: f"{high:g}"})[1] == []  # the ends are in the range


def test_an_argument_out_of_range_falls_back_to_the_variable() -> None:
    """start(poll_interval=1e300) with FR_OTEL_POLL_INTERVAL=0.5: the argument is refused (one line), the variable wins."""
    from fr_otel.agent.config import resolve_config

    config, problems = resolve_config({"poll_interval": 1e300}, {"FR_OTEL_POLL_INTERVAL": "0.5"})
    assert config.poll_interval == 0.5
    assert problems == ["argument poll_interval: 1e+300 is out of range (expected 0.01 to 60 s); ignored"]


def test_docs_name_every_settings_range() -> None:
    """docs/agent.md's options table has a range column, and each option's row says what OPTIONS allows."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in docs.splitlines() if line.startswith("| `FR_OTEL_")
            or line.startswith("| `OTEL_")}
    header = next(line for line in docs.splitlines() if line.startswith("| variable |"))
    assert [c.strip() for c in header.split("|")[1:-1]] == ["variable", "`start()` / flag", "default", "range", "meaning"]
    for option in OPTIONS:
        assert option.allowed, option.name
        row = rows.get(option.env)
        assert row is not None, option.env
        assert row.split("|")[4].strip() == option.allowed, (option.env, row)


def test_an_abort_age_below_the_stall_threshold_is_raised_to_it_with_one_line() -> None:
    """FR_OTEL_ABORT_AFTER_SECONDS=12 under a 30 s stall threshold: a forged verdict during a 12 s checkpoint must
    not end a healthy rank, so the abort age is the threshold, said in one problem line; one above it is kept."""
    from fr_otel.agent.config import resolve_config

    env = {"FR_OTEL_ON_HANG": "abort", "FR_OTEL_STALL_SECONDS": "30", "FR_OTEL_ABORT_AFTER_SECONDS": "12"}
    config, problems = resolve_config(environ=env)
    assert config.abort_after_s == 30 and len(problems) == 1 and "below the stall threshold" in problems[0]
    config, problems = resolve_config(environ={**env, "FR_OTEL_ABORT_AFTER_SECONDS": "45"})
    assert config.abort_after_s == 45 and problems == []
    assert AgentConfig(stall_seconds=30, abort_after_seconds=0.5).abort_after_s == 30
