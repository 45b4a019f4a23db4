"""The multi-host lab itself: hosts with their own names and addresses, a real gloo job across
them, faults that really happen, and nothing of it left behind."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.lab import Lab, lab_unavailable, process_name, process_state, sweep_stale

from fr_otel.testing.otlp import wait_for

pytestmark = [
    pytest.mark.gloo,
    pytest.mark.lab,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="real gloo jobs need the torch extra"),
    pytest.mark.skipif(bool(lab_unavailable()), reason=lab_unavailable() or ""),
]

TRAIN_LOOP = Path(importlib.util.find_spec("support.train_loop").origin)  # type: ignore[union-attr,arg-type]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FR_OTEL_", "OTEL_", "TRAIN_LOOP_"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def test_a_gloo_job_runs_across_three_hosts_each_rank_on_its_own_hostname_and_the_lab_leaves_nothing(
        tmp_path: Path) -> None:
    """3 hosts x 2 ranks finish a gloo job; each rank's gethostname() is its host's; close removes everything."""
    with Lab(3, log_dir=tmp_path) as lab:
        job = lab.torchrun(TRAIN_LOOP, nproc_per_node=2, env=_env(TRAIN_LOOP_STEPS="6", TRAIN_LOOP_GLOO_TIMEOUT="20"))
        assert job.wait(90), f"the job did not finish\n{job.logs()}"
        codes = [p.returncode for p in job.launchers]
        hosts = {rank: lab.hostnames[job.node_of_rank(rank)] for rank in range(job.world_size)}
        seen = {rank: step.host for rank, step in job.steps().items()}  # the rank's own socket.gethostname()
        pids = job.worker_pids()
        exits = job.worker_exit_times()
    assert codes == [0, 0, 0], job.logs()
    assert sorted((tmp_path / "markers").glob("done_rank_*")) == [tmp_path / "markers" / f"done_rank_{r}" for r in range(6)]
    assert hosts == {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}
    assert seen == hosts
    assert len(pids) == 6 and all(exits[r] is not None for r in range(6))
    assert lab.leftovers() == []


def test_each_host_sees_only_its_own_lab_address_and_reaches_the_others_by_name(tmp_path: Path) -> None:
    """A host's interfaces are lo and lab0 with its 10.213.0.x address; node1 reaches node0 by name."""
    server = "import socket; s = socket.create_server(('0.0.0.0', 7000)); c, _ = s.accept(); c.sendall(b'hi')"
    client = ("import socket, time\nfor _ in range(100):\n    try:\n"
              "        print(socket.create_connection(('node0', 7000), timeout=5).recv(2).decode()); break\n"
              "    except ConnectionRefusedError:\n        time.sleep(0.1)")
    with Lab(2, log_dir=tmp_path) as lab:
        addrs = [lab.spawn(k, ["ip", "-o", "-4", "addr", "show"], name="addr") for k in range(2)]
        assert [p.wait(30) for p in addrs] == [0, 0]
        listen = lab.spawn(0, [sys.executable, "-c", server], name="server")
        talk = lab.spawn(1, [sys.executable, "-c", client], name="client")
        assert talk.wait(60) == 0 and listen.wait(30) == 0, talk.output() + listen.output()
        shown = [p.stdout_path.read_text() for p in addrs]
        reply = talk.stdout_path.read_text().strip()
    for k, text in enumerate(shown):
        inet = sorted(line.split()[1] + " " + line.split()[3] for line in text.splitlines())
        assert inet == [f"lab0 10.213.0.{k + 1}/24", "lo 127.0.0.1/8"]
    assert reply == "hi"
    assert lab.leftovers() == []


def test_a_partition_blocks_traffic_without_a_reset_and_a_frozen_host_is_thawed_for_its_cleanup(
        tmp_path: Path) -> None:
    """Across a partition a connect times out (no reset, no refusal); close kills a frozen host's processes."""
    client = ("import socket\ntry:\n    socket.create_connection(('node0', 7000), timeout=2)\n"
              "except TimeoutError:\n    print('timeout')\nexcept OSError as e:\n    print(type(e).__name__)")
    with Lab(2, log_dir=tmp_path) as lab:
        lab.partition(1)
        talk = lab.spawn(1, [sys.executable, "-c", client], name="client")
        assert talk.wait(30) == 0, talk.output()
        sleeper = lab.spawn(0, ["sleep", "300"], name="sleep")
        # In the namespace is not yet `sleep`: its wrappers run first (`ip netns exec`, `unshare`, `sh` running
        # `hostname` through vfork), and a freeze before the last exec leaves sh in the vfork wait (state D, deaf
        # to SIGSTOP) until the thaw.
        assert wait_for(lambda: sleeper.pid in lab.pids(0) and process_name(sleeper.pid) == "sleep", timeout=120), (
            f"sleep {sleeper.pid} never ran in node0: {process_name(sleeper.pid)!r} in state "
            f"{process_state(sleeper.pid)!r}, kernel wait {_wchan(sleeper.pid)!r}")
        lab.freeze(0)
        # A loaded box can take seconds to stop a process: wait on the state itself, generously, and say it.
        assert wait_for(lambda: process_state(sleeper.pid) == "T", timeout=60), (
            f"sleep {sleeper.pid} not stopped 60 s after the freeze: state {process_state(sleeper.pid)!r}, "
            f"kernel wait {_wchan(sleeper.pid)!r}")
    assert talk.stdout_path.read_text().strip() == "timeout"
    assert sleeper.returncode == -9
    assert lab.leftovers() == []


def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def test_a_lab_left_by_a_killed_process_is_swept_by_the_next_one(tmp_path: Path) -> None:
    """A lab whose pytest died by SIGKILL (no finally, no atexit) is removed, processes first, by the next lab."""
    # The pid is printed once the process is in its host's namespace: spawn returns before `ip netns exec`
    # has entered it, and a sweep that runs meanwhile finds no process there to kill (seen on a loaded box).
    script = ("import sys, time; sys.path.insert(0, sys.argv[1]); from support.lab import Lab\n"
              "lab = Lab(2, log_dir=sys.argv[2]).start(); p = lab.spawn(1, ['sleep', '300'])\n"
              "t = time.monotonic()\n"
              "while p.pid not in lab.pids(1) and time.monotonic() - t < 20: time.sleep(0.05)\n"
              "print(lab.prefix, p.pid, flush=True); time.sleep(300)")
    tests = str(Path(__file__).resolve().parents[1])
    owner = subprocess.Popen([sys.executable, "-c", script, tests, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        prefix, pid = owner.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        owner.kill()
        owner.wait()
    assert prefix in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    removed = sweep_stale()
    assert f"namespace {prefix}n0" in removed and f"link {prefix}b" in removed
    assert wait_for(lambda: process_state(int(pid)) in ("", "Z"), timeout=10)
    assert prefix not in subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout


def test_a_prometheus_on_one_host_scrapes_another_at_its_lab_address_and_answers_the_test(tmp_path: Path) -> None:
    """lab.prometheus(0, ...) runs on node0, scrapes node1's 10.213.0.2 (unreachable from here) and answers queries."""
    served = tmp_path / "served"
    served.mkdir()
    (served / "metrics").write_text("lab_probe 42\n")
    with Lab(2, log_dir=tmp_path) as lab:
        lab.spawn(1, [sys.executable, "-m", "http.server", "--bind", lab.ips[1], "--directory", str(served), "9740"],
                  name="http")
        with lab.prometheus(0, [f"{lab.ips[1]}:9740"], scrape_interval="1s") as prom:
            samples = prom.wait_for("lab_probe", timeout=30)
            node = lab.node_of(prom.pid) if prom.pid is not None else None
    assert [(s.labels["instance"], s.value) for s in samples] == [("10.213.0.2:9740", 42.0)]
    assert node == 0
    assert lab.leftovers() == []


def test_a_slow_host_is_held_to_its_cpu_fraction_by_a_cgroup_quota(tmp_path: Path) -> None:
    """slow(node, 0.1) puts the host's processes in a cgroup whose CPU quota really throttles a busy loop."""
    with Lab(1, log_dir=tmp_path) as lab:
        busy = lab.spawn(0, [sys.executable, "-c", "while True: pass"], name="busy")
        assert wait_for(lambda: busy.pid in lab.pids(0), timeout=10)
        written = lab.slow(0, 0.1)
        limit = Path(written).parent
        assert str(busy.pid) in (limit / "cgroup.procs").read_text().split()
        usage_before = _cpu_seconds(busy.pid)
        started = time.monotonic()
        assert wait_for(lambda: _throttled(limit) >= 5, timeout=10), (limit / "cpu.stat").read_text()
        used = (_cpu_seconds(busy.pid) - usage_before) / (time.monotonic() - started)
    assert used <= 0.2, f"{used:.2f} CPU under a 0.1 quota"
    assert lab.leftovers() == []


def _throttled(cgroup: Path) -> int:
    """How many periods the cgroup's quota stopped it (v1 and v2 both name it nr_throttled)."""
    stats = dict(line.split() for line in (cgroup / "cpu.stat").read_text().splitlines())
    return int(stats["nr_throttled"])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
