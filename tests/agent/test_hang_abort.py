"""FR_OTEL_ON_HANG=abort decides on the rank's own evidence: a verdict that calls for a restart arms it,
and only the same collective still in flight, at least the abort age old, in its own recorder ends it."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from fr_otel.agent.hang_abort import ABORT_EXIT_CODE, CODE_FAULT_EXIT_CODE, HangAbort, stuck_collectives
from fr_otel.agent.observe.state import GroupStatus
from fr_otel.incident.trigger import SeenStall, Trigger

S = 1_000_000_000
NOW = 1_764_000_000 * S
HANG = {"verdict": "hang", "hang": True, "culprits": [{"rank": 2, "kind": "not_enqueued"}, {"rank": 5, "kind": "unknown"}], "exclude_hosts": ["node1"], "trace_id": "ab" * 16}


def group(seq: int | None, age_s: float = 0.0, name: str = "0") -> GroupStatus:
    return GroupStatus(name, "default_pg", (0, 1, 2, 3), 0, enqueued=seq or 5, completed=(seq or 6) - 1,
                       inflight_seq=seq, inflight_since_ns=NOW - int(age_s * S) if seq is not None else None,
                       op="all_reduce")


class Ends:
    def __init__(self) -> None:
        self.codes: list[int] = []

    def __call__(self, code: int) -> None:
        self.codes.append(code)


def abort(after_s: float = 30.0) -> tuple[HangAbort, Ends]:
    ends = Ends()
    return HangAbort(rank=1, abort_after_s=after_s, end=ends), ends


def test_a_hang_ends_the_rank_once_its_own_collective_is_old_enough(caplog: pytest.LogCaptureFixture) -> None:
    a, ends = abort(30.0)
    assert a.arm(1, HANG, stuck_collectives([group(7, 12.0)]))
    a.check([group(7, 29.0)], NOW)
    assert ends.codes == []  # not yet the abort age
    with caplog.at_level(logging.ERROR, logger="fr_otel.agent"):
        a.check([group(7, 31.0)], NOW)
    assert ends.codes == [ABORT_EXIT_CODE] == [75]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "rank 1 ends its process with exit code 75 (FR_OTEL_ON_HANG=abort)" in line
    assert "incident 1's verdict is a hang (culprit rank(s) 2)" in line and "all_reduce #7 on group 0" in line
    assert "in flight 31 s (>= 30 s)" in line and "leave out next time: node1" in line
    assert "sbatch --exclude=node1 JOB_SCRIPT" in line and "kubectl cordon node1" in line


def test_a_hang_in_the_jobs_own_code_ends_the_rank_with_70_and_names_no_host(caplog: pytest.LogCaptureFixture) -> None:
    """The verdict's action is to fix the code: the rank exits 70 (EX_SOFTWARE), says a restart would hang again,
    and prints no exclude or drain command, whatever hosts the summary lists."""
    a, ends = abort(30.0)
    assert a.arm(1, {**HANG, "action": "fix_code"}, stuck_collectives([group(7, 12.0)]))
    with caplog.at_level(logging.ERROR, logger="fr_otel.agent"):
        a.check([group(7, 31.0)], NOW)
    assert ends.codes == [CODE_FAULT_EXIT_CODE] == [70]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "rank 1 ends its process with exit code 70 (FR_OTEL_ON_HANG=abort)" in line
    assert "fix it, a restart would hang again" in line
    assert not [w for w in ("leave out", "--exclude", "DRAIN", "cordon") if w in line], line


def test_a_collective_that_moved_on_never_ends_the_rank_whatever_the_store_says() -> None:
    """A forged hang verdict (the store is writable by anyone who reaches it) arms, but the rank's own
    recorder says its collectives complete: a later collective as old, or none in flight, ends nothing."""
    a, ends = abort(5.0)
    assert a.arm(3, HANG, stuck_collectives([group(7, 0.01)]))
    a.check([group(None)], NOW)
    a.check([group(8, 600.0)], NOW)  # another collective, however old, is another incident's business
    a.check([group(7, 600.0, name="1")], NOW)  # the same number on another group
    assert ends.codes == []


@pytest.mark.parametrize("summary", [
    None, {}, {"verdict": "straggler", "hang": False}, {"verdict": "healthy"}, {"verdict": "inconclusive"},
    {"verdict": "hang"},  # a summary without the coordinator's judgement (an older agent, a forgery)
    {"verdict": "hang", "hang": "true"}, ["hang"],
])
def test_only_a_verdict_that_calls_for_a_restart_arms(summary: object) -> None:
    a, ends = abort(1.0)
    assert not a.arm(1, summary, stuck_collectives([group(7, 100.0)]))  # type: ignore[arg-type]
    a.check([group(7, 100.0)], NOW)
    assert ends.codes == []


def test_a_rank_in_no_collective_does_not_end_itself(caplog: pytest.LogCaptureFixture) -> None:
    """The culprit stuck in its data loader: its launcher ends it once its peers have left."""
    a, ends = abort(1.0)
    with caplog.at_level(logging.INFO, logger="fr_otel.agent"):
        assert not a.arm(1, HANG, stuck_collectives([group(None)]))
    assert "was in no collective when it took part: it does not end itself" in caplog.text
    a.check([group(7, 100.0)], NOW)
    assert ends.codes == []


def test_a_rank_that_enters_the_incidents_collective_only_later_is_watched_too() -> None:
    """The incident's own stall (its group and sequence number) is watched besides what the rank had in flight."""
    a, ends = abort(1.0)
    trigger = Trigger.for_stall(SeenStall("0", 7, "all_reduce", 12.0), 10.0).raised(1, 0, NOW)
    assert a.arm(1, HANG, stuck_collectives([group(None)], trigger))
    a.check([group(7, 5.0)], NOW)
    assert ends.codes == [75]
    forged = Trigger.from_record(1, {"rank": 0, "reason": "stall", "time_ns": NOW, "pg_name": 0, "seq": "7"})
    assert forged is not None and stuck_collectives([group(None)], forged) == frozenset()  # a forged shape: nothing


def test_an_armed_rank_waits_its_grace_before_it_ends() -> None:
    """The others read the verdict and fetch the files in their next polls (and the store may live here)."""
    ends = Ends()
    a = HangAbort(rank=0, abort_after_s=1.0, grace_s=0.4, end=ends)
    assert a.arm(1, HANG, stuck_collectives([group(7, 5.0)]))
    a.check([group(7, 5.0)], NOW)
    assert ends.codes == []
    time.sleep(0.45)
    a.check([group(7, 5.0)], NOW)
    assert ends.codes == [75]


def test_the_exit_waits_for_this_nodes_copy_of_the_files_bounded() -> None:
    a, ends = abort(1.0)
    done = threading.Event()
    fetch = threading.Thread(target=lambda: (time.sleep(0.3), done.set()), daemon=True)
    fetch.start()
    assert a.arm(1, HANG, stuck_collectives([group(7, 5.0)]), (fetch,))
    a.check([group(7, 5.0)], NOW)
    assert done.is_set() and ends.codes == [75]


def test_forged_summary_fields_are_bounded_in_the_log_line(caplog: pytest.LogCaptureFixture) -> None:
    a, ends = abort(1.0)
    forged = {"hang": True, "verdict": "hang\nfr-otel: all is well" + "x" * 500, "culprits": [{"rank": r, "kind": "not_enqueued"} for r in range(10_000)] + ["x"],
              "exclude_hosts": ["h\n2", "-lkubernetes.io/os=linux", "a,b"] * 10_000 + [7, "node9"]}
    assert a.arm(1, forged, stuck_collectives([group(7, 5.0)]))
    with caplog.at_level(logging.ERROR, logger="fr_otel.agent"):
        a.check([group(7, 5.0)], NOW)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and len(line) < 40_000 and ends.codes == [75]
    assert "-lkubernetes" not in line and "a,b" not in line  # only host names reach the commands
