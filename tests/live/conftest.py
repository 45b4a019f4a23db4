"""Fixtures of the real multi-process tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from support.jobs import Job


@pytest.fixture
def jobs() -> Iterator[list[Job]]:
    """Jobs a test starts: each is ended whole (launcher, its session, its ranks) when the test ends."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()
