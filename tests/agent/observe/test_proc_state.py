"""Reading a host's ranks from /proc: real processes spinning, sleeping, stopped and gone; the OOM counters.

What a host-mate reads is the evidence a silent rank's cause rests on (``fr_otel.diagnosis.cause``), so each
state is read off a real process here, not a fixture file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fr_otel.agent.observe import proc_state
from fr_otel.agent.observe.proc_state import OomBaseline, sample_processes

SPIN = "while True: pass"
SLEEP = "import time; time.sleep(600)"


@pytest.fixture
def processes() -> list[subprocess.Popen[bytes]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        p.kill()
        p.wait()


def _start(processes: list[subprocess.Popen[bytes]], code: str) -> int:
    p = subprocess.Popen([sys.executable, "-c", code])
    processes.append(p)
    return p.pid


def test_running_sleeping_stopped_and_gone_processes_read_as_such(processes: list[subprocess.Popen[bytes]]) -> None:
    spin, sleep, stopped = (_start(processes, c) for c in (SPIN, SLEEP, SLEEP))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    time.sleep(0.5)
    os.kill(stopped, signal.SIGSTOP)
    time.sleep(0.1)
    facts = sample_processes({0: spin, 1: sleep, 2: stopped, 3: gone.pid}, 9, OomBaseline.now(), sample_s=0.5)
    # A busy box shares its cores (CI runs four workers on two): the spinner gets some of one, the sleeper none.
    assert facts[0].state == "R" and facts[0].cpu > 0.1 and facts[0].threads[0].cpu > 0.1
    assert facts[1].state == "S" and facts[1].cpu < 0.05 and facts[1].wchan  # a sleep's kernel wait
    assert facts[2].state == "T"
    assert facts[3].gone and facts[3].pid == gone.pid
    assert {f.seen_by for f in facts.values()} == {9} and all(f.sample_s >= 0.5 for f in facts.values())
    os.kill(stopped, signal.SIGCONT)


def test_each_process_is_measured_over_its_own_window_and_keeps_its_main_thread(
        processes: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader held up between two ranks' reads (a busy host, mid-incident) does not make a spinner read as
    several cores; a main thread idle among ten spinning threads stays in the kept threads."""
    sleeper = _start(processes, SLEEP)
    spinner = _start(processes, SPIN)
    crowd = _start(processes, "import threading, time\n"
                              "def spin():\n    while True: pass\n"
                              "for _ in range(10): threading.Thread(target=spin, daemon=True).start()\n"
                              "time.sleep(600)")
    time.sleep(0.5)
    read = proc_state._threads

    def held_up(pid: int) -> dict[int, tuple[str, str, int]]:
        if pid == sleeper:
            time.sleep(0.4)  # the reader descheduled before this read
        return read(pid)
    monkeypatch.setattr(proc_state, "_threads", held_up)
    facts = sample_processes({0: sleeper, 1: spinner, 2: crowd}, 9, OomBaseline.now(), sample_s=0.1)
    assert facts[1].sample_s >= 0.45 and facts[1].cpu <= 1.15, facts[1]  # one core at most, not (0.1 + 0.4) / 0.1
    main = facts[2].main_thread
    assert len(facts[2].threads) == 8 and main is not None and main.tid == crowd and main.cpu < 0.05, facts[2]


def test_a_main_thread_past_the_read_limit_is_read_all_the_same(processes: list[subprocess.Popen[bytes]],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Once pids wrap, a process's threads can have lower tids than its main thread: the limit on threads read
    never leaves the main one out (the process would read as gone)."""
    pid = _start(processes, SLEEP)
    real = os.listdir
    monkeypatch.setattr(proc_state, "_MAX_THREADS_READ", 3)
    monkeypatch.setattr(proc_state.os, "listdir", lambda path: ["1", "2", "3", *real(path)] if "/task" in str(path)
                        else real(path))
    facts = sample_processes({0: pid}, 9, OomBaseline.now(), sample_s=0.0)
    assert not facts[0].gone and facts[0].main_thread is not None, facts[0]


def test_ranks_sharing_one_process_share_its_one_read(processes: list[subprocess.Popen[bytes]]) -> None:
    pid = _start(processes, SLEEP)
    facts = sample_processes({r: pid for r in range(16)}, 0, OomBaseline.now(), sample_s=0.0)
    assert set(facts) == set(range(16)) and len({id(f) for f in facts.values()}) == 1


def test_oom_kills_count_from_the_agents_start_in_v1_and_v2_files(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The counters are read from the memory cgroup's own file: v1 memory.oom_control, v2 memory.events."""
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n")
    assert proc_state._oom_count(str(v1)) == 3 and proc_state._oom_count(str(v2)) == 2
    baseline = OomBaseline(host=5, cgroups={str(v1): 1})
    assert baseline.since(str(v1)) == 2  # two kills since the agent started
    assert baseline.since(str(v2)) == 2  # a cgroup it did not know at start: every kill it counted
    assert baseline.since(None) is None and baseline.since(str(tmp_path / "none")) is None


def test_its_own_memory_cgroup_is_found_from_proc() -> None:
    """The folder /proc/self/cgroup names holds one of the two counter files (where a memory cgroup is mounted)."""
    folder = proc_state._memory_cgroup("self")
    if folder is not None:
        assert any((Path(folder) / name).exists() for name in ("memory.oom_control", "memory.events"))
    else:  # no memory controller mounted at all: the reader says unknown, never a wrong count
        assert OomBaseline.now().cgroups == {}


def test_a_memory_limit_is_read_with_its_use_and_hits_in_v1_and_v2_files(tmp_path: Path) -> None:
    """v1 usage, limit and failcnt; v2 current, max and memory.events' max; no limit (v1's huge one, v2's "max")."""
    v1, v2, free = tmp_path / "v1", tmp_path / "v2", tmp_path / "free"
    for folder in (v1, v2, free):
        folder.mkdir()
    (v1 / "memory.usage_in_bytes").write_text("134000000\n")
    (v1 / "memory.limit_in_bytes").write_text("134217728\n")
    (v1 / "memory.failcnt").write_text("70000\n")
    (v2 / "memory.current").write_text("100\n")
    (v2 / "memory.max").write_text("200\n")
    (v2 / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 0\noom_kill 0\n")
    (free / "memory.usage_in_bytes").write_text("100\n")
    (free / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (free / "memory.failcnt").write_text("0\n")
    assert proc_state._memory_count(str(v1)) == (134000000, 134217728, 70000)
    assert proc_state._memory_count(str(v2)) == (100, 200, 7)
    assert proc_state._memory_count(str(free)) is None and proc_state._memory_count(None) is None


def test_a_process_waiting_on_its_child_is_read_with_the_childs_pid_state_and_command(
        processes: list[subprocess.Popen[bytes]]) -> None:
    parent = _start(processes, "import subprocess; subprocess.run(['sleep', '30'])")
    deadline = time.monotonic() + 10
    facts = sample_processes({0: parent}, 9, OomBaseline.now())
    while not facts[0].children and time.monotonic() < deadline:
        time.sleep(0.1)
        facts = sample_processes({0: parent}, 9, OomBaseline.now())
    (child,) = facts[0].children
    assert child.command == "sleep 30" and child.state == "S" and facts[0].wchan.endswith("wait")
    os.kill(child.pid, signal.SIGKILL)


def test_a_gone_processs_oom_kills_are_counted_again_as_the_incident_concludes() -> None:
    """A kill the host counted after the ranks were read counts at the end; a live process's read is kept."""
    from fr_otel.read.rank_facts import ProcessFacts

    now = proc_state._host_oom_count()
    if now is None:
        pytest.skip("no /proc/vmstat oom_kill on this kernel")
    baseline = OomBaseline(host=now - 2, cgroups={})
    gone = proc_state.recount_ooms(ProcessFacts(7, "gone", oom_kills=None, host_oom_kills=0), baseline)
    assert gone.host_oom_kills == 2
    alive = ProcessFacts(7, "S", host_oom_kills=0)
    assert proc_state.recount_ooms(alive, baseline) is alive
