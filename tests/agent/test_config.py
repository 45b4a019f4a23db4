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
