"""Why a culprit stopped: each cause class from the evidence that names it, and only from that (no torch).

The live jobs (tests/live/test_causes.py) make each cause real; these pin the rules themselves, the order
they apply in (the strongest evidence first) and the untrusted-input boundary of the facts they read.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fr_otel.diagnosis.cause import find_cause
from fr_otel.diagnosis.cause_kinds import CAUSES, Cause, CauseClass, Domain, cause_from_json
from fr_otel.diagnosis.kinds import CulpritKind
from fr_otel.diagnosis.verdict import Culprit
from fr_otel.read.frame import Frame
from fr_otel.read.last_record import LastRecord
from fr_otel.read.live_stack import LiveStacks, ThreadStack
from fr_otel.read.rank_facts import ExitRecord, ProcessFacts, ThreadFacts, exit_from_raw, facts_from_raw, \
    host_view_from_raw

TRAIN = "/job/train.py"


def culprit(kind: CulpritKind = CulpritKind.NOT_ENQUEUED, now: LiveStacks | None = None, host: str = "n1",
            rank: int = 2) -> Culprit:
    return Culprit(rank=rank, kind=kind, group_name="0", group_desc="default_pg", collective_seq_id=7, evidence="",
                   op="all_reduce", waiting_ranks=(0, 1, 3), last_frame=None, host=host, now=now)


def stack(*threads: tuple[str, list[Frame], str], in_collective: str | None = None) -> LiveStacks:
    return LiveStacks(1, tuple(ThreadStack(name, i + 1, tuple(frames), code)
                               for i, (name, frames, code) in enumerate(threads)), in_collective)


def main(frames: list[Frame], code: str = "") -> tuple[str, list[Frame], str]:
    return ("MainThread", frames, code)


def proc(state: str = "S", cpu: float = 0.0, wchan: str = "", **kw: object) -> ProcessFacts:
    return ProcessFacts(4242, state, cpu, wchan, (ThreadFacts(4242, "python", state, cpu, wchan),), sample_s=0.3,
                        seen_by=1, **kw)  # type: ignore[arg-type]


def cls(c: Culprit, facts: ProcessFacts | None = None, leaving: ExitRecord | None = None,
        lost: set[str] | None = None, stragglers: tuple[Culprit, ...] = ()) -> CauseClass:
    return find_cause(c, facts, leaving, lost or set(), stragglers).cls


def test_the_table_has_a_label_evidence_and_next_step_for_every_class() -> None:
    assert set(CAUSES) == set(CauseClass)
    assert all(i.label and i.needs and i.next_step for i in CAUSES.values())


@pytest.mark.parametrize(("frames", "code", "facts", "want"), [
    ([Frame("main", TRAIN, 9)], "n = (n * 31 + 7) % 1_000_003", proc("R", 1.0), CauseClass.PYTHON_BUSY),
    ([Frame("main", TRAIN, 9)], "n = (n * 31 + 7) % 1_000_003", proc("R", 0.02), CauseClass.PYTHON_BUSY),  # starved
    ([Frame("step", TRAIN, 20), Frame("main", TRAIN, 9)], "acc += v * v", proc("R", 1.0), CauseClass.PYTHON_BUSY),
    ([Frame("main", TRAIN, 9)], "c = a @ b", proc("R", 1.0), CauseClass.NATIVE_BUSY),
    ([Frame("main", TRAIN, 9)], "total = torch.mm(a, b)", proc("R", 1.0), CauseClass.NATIVE_BUSY),
    ([Frame("forward", "/venv/torch/nn/modules/linear.py", 125), Frame("main", TRAIN, 9)], "y = model(x)",
     proc("R", 1.0), CauseClass.NATIVE_BUSY),
    ([Frame("main", TRAIN, 9)], "time.sleep(30)", proc("S", 0.0, "hrtimer_nanosleep"), CauseClass.SLEEPING),
    ([Frame("wait", "/usr/lib/python3.11/threading.py", 327), Frame("wait", "/usr/lib/python3.11/threading.py", 629),
      Frame("main", TRAIN, 9)], "stop.wait()", proc("S", 0.0, "futex_wait_queue"), CauseClass.SLEEPING),
    ([Frame("main", TRAIN, 9)], "total = compute(x)", proc("S", 0.0, "futex_wait_queue"), CauseClass.SLEEPING),
    ([Frame("wait", "/usr/lib/python3.11/threading.py", 327), Frame("get", "/usr/lib/python3.11/queue.py", 171),
      Frame("main", TRAIN, 9)], "batch = q.get()", proc("S", 0.0, "futex_wait_queue"), CauseClass.THREAD_WAIT),
    ([Frame("_try_wait", "/usr/lib/python3.11/subprocess.py", 1959), Frame("main", TRAIN, 9)],
     "subprocess.run(cmd)", proc("S", 0.0, "do_wait"), CauseClass.CHILD_WAIT),
    ([Frame("main", TRAIN, 9)], "os.waitpid(pid, 0)", proc("S", 0.0, "do_wait"), CauseClass.CHILD_WAIT),
    ([Frame("_try_get_data", "/venv/torch/utils/data/dataloader.py", 1133), Frame("main", TRAIN, 9)], "", proc(),
     CauseClass.DATA_WAIT),
    ([Frame("main", TRAIN, 9)], "lock.acquire()", proc("S", 0.0, "futex_wait_queue"), CauseClass.LOCK_WAIT),
    ([Frame("main", TRAIN, 9)], "data = fifo.read()", proc("S", 0.0, "pipe_read"), CauseClass.IO_WAIT),
    ([Frame("main", TRAIN, 9)], "x = f(y)", proc("S", 0.0, "pipe_read"), CauseClass.IO_WAIT),
])
def test_the_live_stack_and_proc_name_the_cause(frames: list[Frame], code: str, facts: ProcessFacts,
                                                 want: CauseClass) -> None:
    assert cls(culprit(now=stack(main(frames, code))), facts) == want


def test_two_threads_each_in_acquire_off_the_cpu_are_a_deadlock_and_on_the_cpu_only_a_lock_wait() -> None:
    now = stack(main([Frame("main", TRAIN, 40)], "with b:"), ("loader-thread", [Frame("other", TRAIN, 30)], "with a:"))
    found = find_cause(culprit(now=now), proc("S", 0.0, "futex_wait_queue"), None, set())
    assert found.cls == CauseClass.DEADLOCK and any("loader-thread" in e and f"{TRAIN}:30" in e for e in found.evidence)
    assert cls(culprit(now=now), proc("S", 0.0, "hrtimer_nanosleep")) == CauseClass.SLEEPING  # no futex: no lock
    named = stack(main([Frame("main", TRAIN, 40)], "lock_b.acquire()"),
                  ("loader-thread", [Frame("other", TRAIN, 30)], "lock_a.acquire()"))
    assert cls(culprit(now=named), proc("R", 1.0)) == CauseClass.LOCK_WAIT  # one of them spins: not stuck on each other
    alone = stack(main([Frame("main", TRAIN, 40)], "with b:"), ("worker", [Frame("run", TRAIN, 5)], "x = y + 1"))
    assert cls(culprit(now=alone), proc("S", 0.0, "futex_wait_queue")) == CauseClass.LOCK_WAIT
    # The agent's own thread busy writing the incident (the process at 1.9 cores) does not unmake the deadlock:
    # the thread that waits, the main one, is off the CPU.
    agent_busy = ProcessFacts(4242, "S", 1.92, "futex_do_wait", (ThreadFacts(4243, "python", "R", 1.9, ""),
                                                                  ThreadFacts(4242, "python", "S", 0.0, "futex_do_wait")),
                              sample_s=0.1, seen_by=1)
    busy_found = find_cause(culprit(now=now), agent_busy, None, set())
    assert busy_found.cls == CauseClass.DEADLOCK and "its main thread used 0.00 CPU cores over 0.1 s" in busy_found.evidence
    # Facts without the main thread (an older agent's, an edited file): the process's CPU decides, as it says.
    no_main = ProcessFacts(4242, "S", 1.5, "futex_do_wait", (ThreadFacts(4243, "python", "R", 1.5, ""),), sample_s=0.1)
    assert cls(culprit(now=now), no_main) == CauseClass.LOCK_WAIT


def test_the_process_as_its_host_sees_it_comes_before_its_stack() -> None:
    now = stack(main([Frame("main", TRAIN, 9)], "x = f(y)"))
    assert cls(culprit(now=now), proc("T")) == CauseClass.STOPPED
    assert cls(culprit(), proc("D", wchan="nfs_wait")) == CauseClass.IO_WAIT
    silent = find_cause(culprit(kind=CulpritKind.MISSING_DUMP), proc("R", 1.0), None, set())
    assert silent.cls == CauseClass.GIL_HELD and any("running, 1.00 CPU cores" in e for e in silent.evidence)
    assert cls(culprit(kind=CulpritKind.MISSING_DUMP), proc("S", 0.0, "hrtimer_nanosleep")) == CauseClass.GIL_HELD


def test_a_culprit_known_only_from_its_last_record_keeps_its_cause() -> None:
    """Its kind read from its node-local record (not missing_dump): its own agent still sent nothing, so a live
    process is gil_held, a stopped one stopped, a gone one with an OOM kill oom_killed; a rank that answered is not
    gil_held for being alive."""
    recorded = replace(culprit(), record=LastRecord(1_750_000_000_000_000_000))
    assert cls(recorded, proc("R", 1.0)) == CauseClass.GIL_HELD
    assert cls(recorded, proc("T")) == CauseClass.STOPPED
    assert cls(recorded, ProcessFacts(4242, "gone", 0.0, "", (), oom_kills=1)) == CauseClass.OOM_KILLED
    assert cls(culprit(), proc("R", 1.0)) == CauseClass.UNKNOWN


def test_a_process_that_is_gone_is_oom_killed_when_a_counter_rose_else_crashed() -> None:
    gone = ProcessFacts(4242, "gone", oom_kills=1, host_oom_kills=1, seen_by=1)
    found = find_cause(culprit(kind=CulpritKind.MISSING_DUMP), gone, None, set())
    assert found.cls == CauseClass.OOM_KILLED and "memory cgroup counted 1 OOM kill(s)" in found.evidence[1]
    assert cls(culprit(), ProcessFacts(4242, "gone", oom_kills=None, host_oom_kills=2)) == CauseClass.OOM_KILLED
    assert cls(culprit(), ProcessFacts(4242, "gone", oom_kills=0, host_oom_kills=0)) == CauseClass.CRASHED
    assert cls(culprit(), ProcessFacts(4242, "gone", oom_kills=1), ExitRecord("sigterm")) == CauseClass.CRASHED


def test_an_exit_record_says_how_it_left() -> None:
    raised = ExitRecord("exception", "RuntimeError", "no labels", f"{TRAIN}:12 in step")
    found = find_cause(culprit(), ProcessFacts(4242, "gone"), raised, set())
    assert found == Cause(CauseClass.CRASHED, (f"uncaught RuntimeError: no labels at {TRAIN}:12 in step",), Domain.SOFTWARE)
    assert cls(culprit(), None, ExitRecord("exit")) == CauseClass.EXITED


def test_host_lost_slow_host_device_and_unknown() -> None:
    assert cls(culprit(), proc("R", 1.0), lost={"n1"}) == CauseClass.HOST_LOST
    a, b = culprit(CulpritKind.STRAGGLER, rank=2), culprit(CulpritKind.STRAGGLER, rank=3)
    assert cls(a, stragglers=(a, b)) == CauseClass.SLOW_HOST
    assert cls(a, stragglers=(a, culprit(CulpritKind.STRAGGLER, rank=5, host="n2"))) == CauseClass.UNKNOWN
    inside = stack(main([Frame("main", TRAIN, 9)], "dist.all_reduce(t)"), in_collective="all_reduce")
    assert cls(culprit(CulpritKind.NOT_COMPLETED, now=inside)) == CauseClass.DEVICE
    assert cls(culprit(CulpritKind.NOT_COMPLETED)) == CauseClass.DEVICE
    assert find_cause(culprit(CulpritKind.MISSING_DUMP), None, None, set()) == Cause(CauseClass.UNKNOWN, ())


def dom(c: Culprit, facts: ProcessFacts | None = None, leaving: ExitRecord | None = None,
        lost: set[str] | None = None) -> Domain:
    return find_cause(c, facts, leaving, lost or set()).domain


def test_each_cause_names_whose_fault_it_is_from_its_class_and_where_the_evidence_decides_from_that() -> None:
    """The rank's own code is software; a lost host and a device stall are infrastructure; a signal with no OOM
    record, SIGTERM alone, an exception that names the hardware, a stopped process, a process in uninterruptible
    sleep, a host-level OOM kill with no cgroup of its own, or no evidence at all are unknown."""
    busy = stack(main([Frame("main", TRAIN, 9)], "while True: pass"))
    assert dom(culprit(now=busy), proc("R", 1.0)) == Domain.SOFTWARE
    assert dom(culprit(CulpritKind.MISSING_DUMP), proc("R", 1.0)) == Domain.SOFTWARE  # gil_held
    raised = ExitRecord("exception", "RuntimeError", "no labels", f"{TRAIN}:12 in step")
    assert dom(culprit(), ProcessFacts(4242, "gone"), raised) == Domain.SOFTWARE
    assert dom(culprit(), None, ExitRecord("exit")) == Domain.SOFTWARE
    assert dom(culprit(), ProcessFacts(4242, "gone", oom_kills=1, host_oom_kills=1)) == Domain.SOFTWARE  # its limit
    assert dom(culprit(), proc("R", 1.0), lost={"n1"}) == Domain.INFRASTRUCTURE
    assert dom(culprit(CulpritKind.NOT_COMPLETED)) == Domain.INFRASTRUCTURE
    assert dom(culprit(), proc("D", wchan="nfs_wait")) == Domain.UNKNOWN
    ecc = ExitRecord("exception", "RuntimeError", "CUDA error: uncorrectable ECC error encountered", f"{TRAIN}:3 in f")
    assert dom(culprit(), ProcessFacts(4242, "gone"), ecc) == Domain.UNKNOWN
    read = stack(main([Frame("main", TRAIN, 9)], "data = f.read()"))
    assert dom(culprit(now=read), proc("S", wchan="pipe_read")) == Domain.SOFTWARE  # a FIFO with no writer
    assert dom(culprit(now=read), proc("D", wchan="nfs_wait")) == Domain.UNKNOWN  # a hung mount, or writeback
    assert dom(culprit(), ProcessFacts(4242, "gone", oom_kills=None, host_oom_kills=2)) == Domain.UNKNOWN
    assert dom(culprit(), ProcessFacts(4242, "gone", oom_kills=0, host_oom_kills=0)) == Domain.UNKNOWN  # a signal
    assert dom(culprit(), proc("S"), ExitRecord("sigterm")) == Domain.UNKNOWN
    assert dom(culprit(), proc("T")) == Domain.UNKNOWN
    assert dom(culprit(CulpritKind.MISSING_DUMP)) == Domain.UNKNOWN
    found = find_cause(culprit(now=busy), proc("R", 1.0), None, set())
    assert found.to_dict()["domain"] == "software" and cause_from_json(found.to_dict()) == found
    host = find_cause(culprit(), ProcessFacts(4242, "gone", host_oom_kills=2), None, set())
    assert cause_from_json(host.to_dict()) == host and cause_from_json({**host.to_dict(), "domain": "x"}).domain \
        == Domain.SOFTWARE  # an unknown word is the class's own
    # A file cannot make a code fault evidence against a host, nor a lost host the code's: only the row's other.
    assert cause_from_json({**found.to_dict(), "domain": "infrastructure"}).domain == Domain.SOFTWARE
    lost = find_cause(culprit(), proc("R", 1.0), None, {"n1"})
    assert cause_from_json({**lost.to_dict(), "domain": "software"}).domain == Domain.INFRASTRUCTURE
    with pytest.raises(ValueError):
        Cause(CauseClass.PYTHON_BUSY, (), Domain.INFRASTRUCTURE)


def test_a_rank_that_called_another_collective_diverged_in_its_code_whatever_it_did_after() -> None:
    """A ``mismatch`` culprit's cause is code_divergence (software), even once a failed collective or SIGTERM ended
    it; its evidence is the mismatch itself."""
    diverged = Culprit(rank=2, kind=CulpritKind.MISMATCH, group_name="0", group_desc="default_pg", collective_seq_id=7,
                       evidence="rank 2 called all_gather #7 where ranks 0-1,3 called all_reduce", op="all_gather",
                       waiting_ranks=(0, 1, 3), last_frame=None, host="n1")
    for leaving in (None, ExitRecord("sigterm"), ExitRecord("failure", "DistBackendError", "timeout")):
        found = find_cause(diverged, proc("S"), leaving, set())
        assert found.cls == CauseClass.CODE_DIVERGENCE and found.domain == Domain.SOFTWARE
        assert found.evidence[0].startswith("rank 2 called all_gather #7")


def test_facts_and_records_from_untrusted_data_keep_only_what_is_well_typed() -> None:
    assert facts_from_raw({"pid": 1, "state": "Q"}) is None and facts_from_raw({"pid": -1, "state": "R"}) is None
    facts = facts_from_raw({"pid": 7, "state": "R", "cpu": True, "wchan": "\x1b]0;x\x07", "threads": [
        {"tid": 7, "state": "R", "cpu": 0.9, "name": "py"}, {"tid": "8"}] * 10, "oom_kills": 2 ** 70})
    assert facts is not None and facts.cpu == 0.0 and "\x1b" not in facts.wchan and len(facts.threads) == 4
    assert facts.oom_kills is None
    assert set(host_view_from_raw({"2": {"pid": 3, "state": "S"}, "²": {"pid": 3, "state": "S"}, 5: {}})) == {2}
    assert exit_from_raw({"how": "reboot"}) is None
    record = exit_from_raw({"how": "exception", "type": "E" * 999, "code": 10 ** 9})
    assert record is not None and len(record.type) == 128 and record.code is None
    assert cause_from_json({"class": "nope"}) is None
    assert cause_from_json({"class": "stopped", "evidence": ["a", 3]}) == Cause(CauseClass.STOPPED, ("a",))


def test_a_gil_held_ranks_outside_stack_is_said_from_its_main_thread() -> None:
    dump = ('Process 7: python train.py\nPython v3.11.7\n\nThread 9 (idle): "loader"\n    get (queue.py:171)\n\n'
            'Thread 7 (active+gil): "MainThread"\n    match (re/__init__.py:166)\n    parse (train.py:40)\n'
            '    step (train.py:12)\n')
    found = find_cause(culprit(kind=CulpritKind.MISSING_DUMP), proc("R", 1.0, outside_stack=dump), None, set())
    assert found.cls == CauseClass.GIL_HELD
    assert found.evidence[-1] == ("Python stack read from outside (py-spy): match (re/__init__.py:166) < "
                                  "parse (train.py:40) < step (train.py:12) (it holds the GIL)")


def test_teardown_is_evidence_beside_the_cause_and_a_thread_idle_in_a_condition_is_no_deadlock() -> None:
    """SIGTERM and a collective's failure are how a hang ends, not why; a pin-memory thread in a condition's wait
    and a main thread in Work.wait() or a join are no deadlock; an OOM kill counted elsewhere is not this rank's."""
    sleeping = stack(main([Frame("main", TRAIN, 9)], "time.sleep(30)"))
    found = find_cause(culprit(now=sleeping), proc("S"), ExitRecord("sigterm"), set())
    assert found.cls == CauseClass.SLEEPING and found.evidence[-1].startswith("then SIGTERM ended it")
    failed = ExitRecord("failure", "DistBackendError", "Connection closed by peer")
    assert cls(culprit(now=sleeping), proc("S"), failed) == CauseClass.SLEEPING
    pin = ("pin_memory", [Frame("wait", "/usr/lib/python3.11/threading.py", 324),
                          Frame("_pin_memory_loop", "/venv/torch/utils/data/_utils/pin_memory.py", 49)], "")
    waiting = stack(main([Frame("train_step", TRAIN, 40)], "work.wait()"), pin)
    assert cls(culprit(CulpritKind.NOT_COMPLETED, waiting), proc("S", 0.0, "futex_wait_queue")) == CauseClass.DEVICE
    joining = stack(main([Frame("save", TRAIN, 40)], "ckpt.join()"),
                    ("tqdm", [Frame("wait", "/usr/lib/python3.11/threading.py", 324)], ""))
    assert cls(culprit(now=joining), proc("S", 0.0, "futex_wait_queue")) == CauseClass.THREAD_WAIT
    assert cls(culprit(), ProcessFacts(4242, "gone", oom_kills=0, host_oom_kills=1)) == CauseClass.CRASHED
    assert cls(culprit(CulpritKind.NOT_COMPLETED), proc("R", 1.0)) == CauseClass.DEVICE  # not gil_held
    assert cls(culprit(), None, ExitRecord("sigterm")) == CauseClass.CRASHED  # nothing else known: the signal


def test_a_named_cause_words_the_next_step_with_its_command_and_a_device_stall_keeps_its_kinds() -> None:
    from dataclasses import replace

    from fr_otel.diagnosis.verdict import Verdict
    from fr_otel.read.rank_process import RankProcess
    from fr_otel.report.advice import as_text, next_step

    v = Verdict(verdict="hang", culprits=[], ranks_loaded=4, world_size=4, problems=[], notes=[], groups=[])
    alive = replace(culprit(kind=CulpritKind.MISSING_DUMP), process=RankProcess(host="n1", pid=4242, source="agent"))

    def step(cause: Cause, c: Culprit = alive) -> str:
        return as_text(next_step(v, replace(c, cause=cause)))
    assert "`ssh n1 py-spy dump --pid 4242 --native`" in step(Cause(CauseClass.GIL_HELD, ()))
    assert "`kill -CONT 4242`" in step(Cause(CauseClass.STOPPED, ()))
    assert step(Cause(CauseClass.DATA_WAIT, ())).startswith("Rank 2: waiting on its data pipeline. Look at the DataLoader")
    stuck = replace(alive, kind=CulpritKind.NOT_COMPLETED)
    assert step(Cause(CauseClass.DEVICE, ()), stuck) == as_text(next_step(v, stuck))  # the kind's own step


def test_docs_list_every_class_with_its_label_domain_and_the_evidence_it_needs_as_the_table_has_them() -> None:
    """docs/verdict.md's cause table is the code's table, row for row: label, failure domain (and when the evidence
    overrides it), evidence."""
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "verdict.md").read_text()
    for cls_, info in CAUSES.items():
        domain = f"`{info.domain}`" + (f"; `{info.other_domain}` {info.domain_when}" if info.other_domain else "")
        assert f"| `{cls_}` | {info.label} | {domain} | {info.needs} |" in docs, cls_


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2 ** 70), 2 ** 70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["pid", "state", "cpu", "wchan", "threads", "tid", "name", "oom_kills", "sampled_ns", "how",
                         "type", "code", "class", "evidence", "outside_stack", "2", "x"]), inner, max_size=6),
    max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON)
def test_untrusted_facts_records_and_causes_never_raise(raw: object) -> None:
    """Whatever a payload, a node summary or an incident.json holds under these keys is read or dropped."""
    facts_from_raw(raw)
    host_view_from_raw(raw)
    host_view_from_raw({"2": raw, "3": {"pid": 1, "state": raw}, "4": {"pid": 1, "state": "S", "threads": raw}})
    exit_from_raw(raw)
    cause_from_json(raw)
    cause_from_json({"class": raw, "evidence": raw})


def test_reads_of_one_process_merge_to_the_newest_keeping_the_one_outside_stack() -> None:
    from fr_otel.read.rank_facts import merge_facts

    lowest = ProcessFacts(7, "S", sampled_ns=10, seen_by=0, outside_stack="Thread 7 (idle): \"MainThread\"\n    f (a.py:1)\n")
    later = ProcessFacts(7, "S", sampled_ns=20, seen_by=3)
    merged = merge_facts(merge_facts(None, lowest), later)
    assert merged.seen_by == 3 and merged.outside_stack == lowest.outside_stack
    assert merge_facts(later, ProcessFacts(8, "S", sampled_ns=5, outside_stack="x")).outside_stack == ""  # another pid


def test_a_host_the_verdict_found_lost_is_the_cause_and_one_unreachable_from_here_is_not() -> None:
    from fr_otel.diagnosis.cause import with_causes
    from fr_otel.diagnosis.hosts import HostFinding

    def on(state: str) -> CauseClass:
        (c,) = with_causes([culprit(CulpritKind.MISSING_DUMP)], {}, {}, [HostFinding("n1", (2, 3), (2,), (2,), state)])
        assert c.cause is not None
        return c.cause.cls
    assert on("lost") == on("cut_off") == on("store_lost") == CauseClass.HOST_LOST
    assert on("unreachable") == CauseClass.UNKNOWN  # a partition seen from one side names no culprit's host


THREADING = "/usr/lib/python3.11/threading.py"


def test_a_wait_on_another_thread_says_that_threads_place_or_death_and_a_child_wait_says_the_child() -> None:
    """A queue's get names the other threads (where each is, which died of what); an Event's wait is asleep unless a
    thread of its process died; a wait on a subprocess names the child's pid, command and state."""
    from fr_otel.read.live_stack import DeadThread
    from fr_otel.read.rank_facts import ChildFacts

    queue_get = (Frame("wait", THREADING, 327), Frame("get", "/usr/lib/python3.11/queue.py", 171), Frame("main", TRAIN, 9))
    getting = LiveStacks(1, (ThreadStack("MainThread", 1, queue_get, "batch = q.get()"),
                             ThreadStack("loader", 2, (Frame("fetch", TRAIN, 30),), "x = load(i)")),
                         dead=(DeadThread("producer", "ValueError", "a corrupt shard", f"{TRAIN}:44 in produce"),))
    found = find_cause(culprit(now=getting), proc("S", 0.0, "futex_wait_queue"), None, set())
    assert found.cls == CauseClass.THREAD_WAIT
    assert found.evidence[1:3] == (f"thread producer died of ValueError: a corrupt shard at {TRAIN}:44 in produce",
                                   f"thread loader in load at {TRAIN}:30 in fetch")
    event = [Frame("wait", THREADING, 327), Frame("wait", THREADING, 629), Frame("main", TRAIN, 9)]
    assert cls(culprit(now=LiveStacks(1, (ThreadStack("MainThread", 1, tuple(event), "ready.wait()"),))),
               proc("S", 0.0, "futex_wait_queue")) == CauseClass.SLEEPING
    orphaned = LiveStacks(1, (ThreadStack("MainThread", 1, tuple(event), "ready.wait()"),), dead=getting.dead)
    assert cls(culprit(now=orphaned), proc("S", 0.0, "futex_wait_queue")) == CauseClass.THREAD_WAIT
    running = stack(main([Frame("_try_wait", "/usr/lib/python3.11/subprocess.py", 1959), Frame("main", TRAIN, 9)],
                         "subprocess.run(['sleep', '300'])"))
    child = find_cause(culprit(now=running), proc("S", 0.0, "do_wait", children=(ChildFacts(77, "S", "sleep 300"),)),
                       None, set())
    assert child.cls == CauseClass.CHILD_WAIT and child.evidence[1] == "child process 77 (sleep 300): sleeping"
    talking = stack(main([Frame("communicate", "/usr/lib/python3.11/subprocess.py", 1209), Frame("main", TRAIN, 9)],
                         "out, _ = p.communicate()"))
    assert cls(culprit(now=talking), proc("S", 0.0, "pipe_read")) == CauseClass.CHILD_WAIT  # not io_wait: its child's


def test_a_rank_at_its_memory_limit_is_memory_pressure_before_io_and_busy_but_after_a_sleep_of_its_own() -> None:
    """Reclaim at the cgroup's limit explains a page wait or a slow loop; it does not explain a sleep or a queue."""
    full = {"memory_use": 0.998, "memory_limit_hits": 7158}
    looping = stack(main([Frame("_fault", TRAIN, 9)], "n += pages[i]"))
    found = find_cause(culprit(now=looping), proc("D", 0.6, "folio_wait_bit_common", **full), None, set())
    assert found.cls == CauseClass.MEMORY_PRESSURE and found.domain == Domain.SOFTWARE
    assert found.evidence[0] == ("its memory cgroup is at 99.8% of its limit and hit it 7158 time(s) in 0.3 s "
                                 "(reclaiming to stay under it)")
    assert cls(culprit(now=stack(main([Frame("main", TRAIN, 9)], "data = f.read()"))),
               proc("S", 0.0, "wait_on_page_bit", **full)) == CauseClass.MEMORY_PRESSURE
    assert cls(culprit(now=stack(main([Frame("main", TRAIN, 9)], "time.sleep(30)"))),
               proc("S", 0.0, "hrtimer_nanosleep", **full)) == CauseClass.SLEEPING
    assert cls(culprit(CulpritKind.MISSING_DUMP), proc("R", 1.0, **full)) == CauseClass.MEMORY_PRESSURE  # not gil_held
    assert cls(culprit(now=looping), proc("R", 1.0, memory_use=0.998, memory_limit_hits=0)) == CauseClass.PYTHON_BUSY
    assert cls(culprit(now=looping), proc("R", 1.0, memory_use=0.5, memory_limit_hits=9)) == CauseClass.PYTHON_BUSY


def test_a_main_thread_starved_of_the_cpu_or_its_gil_is_not_asleep() -> None:
    """On a box busier than its cores a spinning thread gets little CPU (state R), or sleeps in a futex waiting for
    its GIL back from the agent's threads: busy, not asleep; asleep in the kernel elsewhere, it is asleep."""
    loop = stack(main([Frame("_fault", TRAIN, 80)], "while True:"))
    assert cls(culprit(now=loop), proc("R", 0.02)) == CauseClass.PYTHON_BUSY
    assert cls(culprit(now=loop), proc("S", 0.08, "futex_wait_queue")) == CauseClass.PYTHON_BUSY
    assert cls(culprit(now=loop), proc("S", 0.08)) == CauseClass.PYTHON_BUSY  # no kernel wait read: running
    native = stack(main([Frame("main", TRAIN, 9)], "lib.wait_for_device()"))
    assert cls(culprit(now=native), proc("S", 0.0, "hrtimer_nanosleep")) == CauseClass.SLEEPING


def test_the_new_facts_travel_as_json_and_back() -> None:
    """Children, memory use and hits, and dead threads survive incident.json; ill-typed ones are dropped."""
    from fr_otel.read.live_stack import DeadThread, stacks_from_raw
    from fr_otel.read.rank_facts import ChildFacts

    facts = proc("S", 0.0, "do_wait", children=(ChildFacts(77, "S", "sleep 300"),), memory_use=0.5,
                 memory_limit_hits=3)
    assert facts_from_raw(facts.as_json()) == facts
    assert facts_from_raw({**facts.as_json(), "children": [{"pid": -1, "state": "S"}, "x"],
                           "memory_use": "full"}) == ProcessFacts(4242, "S", 0.0, "do_wait", facts.threads,
                                                                  sample_s=0.3, seen_by=1, memory_limit_hits=3)
    now = LiveStacks(1, (ThreadStack("MainThread", 1, (Frame("main", TRAIN, 9),), "q.get()"),),
                     dead=(DeadThread("producer", "ValueError", "bad", f"{TRAIN}:4 in p"),))
    assert stacks_from_raw(now.as_json()) == now
    odd = stacks_from_raw({**now.as_json(), "dead_threads": [{"name": 3}, None]})
    assert odd is not None and odd.dead == ()


def test_the_docs_table_is_in_the_classifiers_order() -> None:
    """docs/verdict.md lists the classes in CAUSES' order: the precedence people read is the one the code applies."""
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "verdict.md").read_text()
    table = docs[docs.index("| class | label | domain | evidence it needs |"):]
    at = [table.index(f"\n| `{c}` | ") for c in CAUSES]
    assert at == sorted(at)
