"""An error message finishes the job. A command printed after a hint carries
the fix the hint gave (run as printed, it works), a prefix or folder that holds no dump says what
would, and dumps of two incidents in one folder get one warning."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fr_otel import analyze, build_job, read_dumps
from fr_otel.testing.dump_builder import DumpBuilder
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver

SRC = Path(__file__).resolve().parents[2] / "src"


def _fr_otel(*args: str) -> subprocess.CompletedProcess[str]:
    """`fr-otel ARGS` in a fresh interpreter, with none of the caller's OTEL_*/FR_OTEL_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run([sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _printed_replay(stderr: str) -> list[str]:
    """The `fr-otel replay ...` command the export printed, as a shell would split it."""
    command = stderr.split("send it later with ", 1)[1].strip()
    words = shlex.split(command)
    assert words[:2] == ["fr-otel", "replay"], command
    return words


def test_after_a_tls_hint_the_printed_replay_command_adds_insecure_and_delivers(nvrx: Path, tmp_path: Path) -> None:
    """host:port to a plaintext collector: the hint says add --insecure, the replay command has it, and run as printed it delivers."""
    with OtlpGrpcReceiver() as rx:
        proc = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--endpoint", rx.endpoint, "--out", str(tmp_path),
                        "--timeout", "5")
        assert proc.returncode == 3 and rx.span_count() == 0, proc.stderr
        assert "add --insecure" in proc.stderr
        words = _printed_replay(proc.stderr)
        assert words[3:] == ["--endpoint", rx.endpoint, "--insecure"], words
        replayed = _fr_otel(*words[1:])
        assert replayed.returncode == 0, replayed.stderr
        assert rx.span_count() > 0


def test_after_a_protocol_hint_the_printed_replay_command_uses_that_protocol_and_delivers(
        nvrx: Path, tmp_path: Path) -> None:
    """OTLP/HTTP sent to a gRPC port: the hint says use --protocol grpc --endpoint http://HOST:PORT, the command says the same and delivers."""
    with OtlpGrpcReceiver() as rx:
        proc = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--protocol", "http/protobuf", "--endpoint",
                        f"{rx.url}/v1/traces", "--out", str(tmp_path), "--timeout", "5")
        assert proc.returncode == 3, proc.stderr
        assert f"use --protocol grpc --endpoint {rx.url}," in proc.stderr
        words = _printed_replay(proc.stderr)
        assert words[3:] == ["--endpoint", rx.url], words  # grpc is replay's default protocol
        replayed = _fr_otel(*words[1:])
        assert replayed.returncode == 0, replayed.stderr
        assert rx.span_count() > 0


def test_a_failed_replay_prints_the_command_that_finishes_it(nvrx: Path, tmp_path: Path) -> None:
    """gRPC replay to an OTLP/HTTP port: the error line ends in the replay command with the fix; run as printed it delivers."""
    written = _fr_otel("export", str(nvrx / "lock_gil_1st"), "--out", str(tmp_path))
    assert written.returncode == 0, written.stderr
    (trace_file,) = tmp_path.glob("fr-otel-trace-*.jsonl")
    with OtlpHttpReceiver() as rx:
        proc = _fr_otel("replay", str(trace_file), "--endpoint", f"http://{rx.endpoint}", "--timeout", "5")
        assert proc.returncode == 3 and rx.span_count() == 0, proc.stderr
        (line,) = proc.stderr.splitlines()
        words = shlex.split(line.split("; run: ", 1)[1])
        assert words == ["fr-otel", "replay", str(trace_file), "--endpoint", f"http://{rx.endpoint}/v1/traces",
                         "--protocol", "http/protobuf"], line
        fixed = _fr_otel(*words[1:])
        assert fixed.returncode == 0 and rx.span_count() > 0, fixed.stderr


def test_a_prefix_that_matches_nothing_shows_the_names_and_the_prefix_they_share(nvrx: Path) -> None:
    """--prefix nccl_trace_rank_ on NVRx's `_dump_<rank>` files: the names seen and --prefix _dump_, which then works."""
    folder = nvrx / "gpu_error_1st"
    proc = _fr_otel("analyze", str(folder), "--prefix", "nccl_trace_rank_")
    assert proc.returncode == 2
    assert (f"{folder}: no dump files (no file name starts with 'nccl_trace_rank_' and ends in a rank number); file "
            "names seen: _dump_0, _dump_1, _dump_10, _dump_11, _dump_12, _dump_13, … (17 files); they would be dumps "
            "with --prefix _dump_") in proc.stderr
    assert _fr_otel("analyze", str(folder), "--prefix", "_dump_").returncode == 0


def test_a_parent_folder_names_its_subfolders_that_hold_dumps(nvrx: Path) -> None:
    """The folder of the four NVRx incidents: each subfolder with its dump count, and one to pass, which works."""
    proc = _fr_otel("analyze", str(nvrx))
    assert proc.returncode == 2
    assert ("subfolders with dumps: gpu_error_1st/ (16 dump files), gpu_error_2nd/ (16 dump files), lock_gil_1st/ "
            f"(16 dump files), lock_gil_2nd/ (16 dump files): pass one of them (one incident each), e.g. "
            f"{nvrx / 'gpu_error_1st'}") in proc.stderr
    assert "file names seen: LICENSE.txt, README.md" in proc.stderr
    assert _fr_otel("analyze", str(nvrx / "gpu_error_1st")).returncode == 0


def _incident(builder: DumpBuilder, folder: Path, written_after_s: float) -> Path:
    """4 ranks, rank 3 never enqueues the 3rd all_reduce; files dated ``written_after_s`` after the last activity."""
    builder.collective(builder.world)
    builder.collective(builder.world)
    builder.collective(builder.world, ranks=[0, 1, 2], done=False)
    builder.write(folder)
    when = builder.clock + int(written_after_s * 1e9)
    for f in folder.iterdir():
        os.utime(f, ns=(when, when))
    return folder


def _problems(folder: Path) -> list[str]:
    return [p for p in analyze(build_job(read_dumps(folder))).problems if "different incidents" in p]


def test_dumps_of_two_incidents_in_one_folder_give_one_warning(tmp_path: Path) -> None:
    """Ranks 2-3 overwritten by an incident 10 minutes later (a restarted job, same dump path): one line saying so."""
    first = _incident(DumpBuilder(4), tmp_path / "first", 30)
    second_builder = DumpBuilder(4)
    second_builder.clock += 600 * 10**9
    second = _incident(second_builder, tmp_path / "second", 30)
    mixed = tmp_path / "mixed"
    shutil.copytree(first, mixed)
    for r in (2, 3):
        shutil.copy2(second / f"nccl_trace_rank_{r}", mixed / f"nccl_trace_rank_{r}")
    assert _problems(first) == [] and _problems(second) == []
    (line,) = _problems(mixed)
    assert line.startswith("these dumps seem to come from different incidents: rank(s) 0-1 were dumped at ")
    assert "but rank(s) 2-3 recorded collectives until" in line and "10 min later" in line


@pytest.mark.parametrize("stuck_s", [30 * 60, 5 * 86400])
def test_a_culprit_stuck_long_before_the_dump_is_not_another_incident(tmp_path: Path, stuck_s: int) -> None:
    """One incident whose culprit's newest activity is 30 minutes (or days) older than its peers': no warning."""
    job = DumpBuilder(4)
    job.collective(job.world)
    job.collective(job.world, ranks=[0, 1, 2], done=False)
    job.clock += stuck_s * 10**9
    tp = job.group("1", "TENSOR_MODEL_PARALLEL_GROUP", [0, 1, 2])
    job.collective(tp, done=False)
    folder = job.write(tmp_path / "one")
    when = job.clock + 30 * 10**9
    for f in folder.iterdir():
        os.utime(f, ns=(when, when))
    assert _problems(folder) == []
