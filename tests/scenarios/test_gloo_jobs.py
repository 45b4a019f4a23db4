"""The real-hang dump factory: one quick gloo job, checked against what the recorder holds."""

from __future__ import annotations

import importlib.util
import json
import pickle
from pathlib import Path

import pytest

from fr_otel.scenarios import SCENARIOS, make_dumps

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs the torch extra"
)


def test_gloo_is_pointed_at_loopback_unless_the_environment_names_an_interface() -> None:
    """One rule for every local gloo job (scenarios, agent tests, benchmarks): loopback, unless already chosen."""
    import socket

    from fr_otel.scenarios.job import gloo_on_loopback

    names = [name for _, name in socket.if_nameindex()]
    env = gloo_on_loopback({})
    assert env.get("GLOO_SOCKET_IFNAME") in ({"lo", "lo0"} & set(names) or {None})
    assert gloo_on_loopback({"GLOO_SOCKET_IFNAME": "eth7"}) == {"GLOO_SOCKET_IFNAME": "eth7"}


@pytest.mark.gloo
@needs_torch
def test_skip_allreduce_dumps_every_rank(tmp_path: Path) -> None:
    """Rank 2 skips world all_reduce #6: it enqueued 5, the others enqueued 6 and completed 5."""
    out = make_dumps("skip_allreduce", tmp_path, timeout_s=120)
    assert out == tmp_path and "skip_allreduce" in SCENARIOS
    for r in range(4):
        assert (out / "pickle" / f"rank_{r}").is_file()
        assert (out / "json" / f"rank_{r}.json").is_file()

    dumps = {r: pickle.loads((out / "pickle" / f"rank_{r}").read_bytes()) for r in range(4)}
    status = {r: d["pg_status"]["0"] for r, d in dumps.items()}
    for r in range(4):
        enqueued = 5 if r == 2 else 6
        assert status[r]["last_enqueued_collective"] == enqueued
        assert status[r]["last_completed_collective"] == 5  # nobody finished #6
        last = dumps[r]["entries"][-1]
        assert (last["collective_seq_id"], last["retired"]) == (enqueued, r == 2)
        assert last["profiling_name"] == "gloo:all_reduce"

    as_json = json.loads((out / "json" / "rank_0.json").read_text())
    assert as_json["pg_status"]["0"]["last_enqueued_collective"] == "6"  # JSON: strings
    meta = json.loads((out / "scenario.json").read_text())
    assert (meta["misbehaving_rank"], meta["group_name"], meta["step"]) == (2, "0", 6)
