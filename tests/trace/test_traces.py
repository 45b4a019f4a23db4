"""Traces from real hangs: one trace, spans per rank linked by collective, real OTLP receivers.

The dumps come from real gloo jobs (fr_otel.scenarios) and the export runs as a
user would run it: the `fr-otel` CLI in a fresh process, against real gRPC/HTTP receivers
on loopback built from the official opentelemetry-proto service stubs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

from fr_otel import analyze, build_job, read_dumps
from fr_otel.trace.spans import TraceOptions, build_trace
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver, ReceivedSpan
from fr_otel.common.ports import unused_tcp_port

pytestmark = pytest.mark.gloo

EXIT_NOT_DELIVERED = 3
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "FR_OTEL_", "TORCHELASTIC_", "SLURM_"))}


def fr_otel(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh interpreter, with only the OTEL_* variables the test sets."""
    return subprocess.run(
        [sys.executable, "-m", "fr_otel.cli", *args], capture_output=True, text=True, timeout=timeout,
        env={**CLEAN_ENV, **(env or {})},
    )


@pytest.fixture(scope="module")
def hung(scenario_dumps) -> Path:
    """Real dumps of a gloo job where rank 3 stalls in subgroup {2,3} and 0,1 wait in the world group."""
    return scenario_dumps("subgroup_stall") / "pickle"


def by_role(spans: list[ReceivedSpan]) -> dict[str, list[ReceivedSpan]]:
    out: dict[str, list[ReceivedSpan]] = defaultdict(list)
    for s in spans:
        out[s.attributes["fr_otel.span"]].append(s)
    return out


def hexid(b: bytes) -> str:
    return b.hex()


def assert_sound_trace(spans: list[ReceivedSpan], job_dir: Path) -> None:
    """One trace; every recorder entry in focus is a span; links and parents resolve; times are the recorder's."""
    assert len({hexid(s.span.trace_id) for s in spans}) == 1
    ids = [hexid(s.span.span_id) for s in spans]
    assert len(ids) == len(set(ids)), "each span exactly once"
    present = set(ids)
    roles = by_role(spans)
    (root,) = roles["incident"]
    assert root.span.parent_span_id == b""
    for s in spans:
        if s is not root:
            assert hexid(s.span.parent_span_id) in present, s.span.name
    job = build_job(read_dumps(job_dir))
    recorded = {
        (rank, e.record_id): e for rank, dump in job.dumps.items() for e in dump.entries
    }
    links_per_collective: dict[str, set[int]] = defaultdict(set)
    for s in roles["entry"]:
        attrs = s.attributes
        rank = attrs["pytorch.distributed.rank"]
        e = recorded[(rank, attrs["pytorch.distributed.record_id"])]
        assert s.span.start_time_unix_nano == e.time_created_ns
        assert s.span.name == e.profiling_name
        assert attrs["pytorch.distributed.pg.name"] == e.pg_name
        assert attrs["pytorch.distributed.collective.seq_id"] == e.collective_seq_id
        assert s.resource_attributes["pytorch.distributed.rank"] == rank
        (link,) = s.span.links
        assert hexid(link.span_id) in present, "the collective span it links to is in the trace"
        links_per_collective[hexid(link.span_id)].add(rank)
    collectives = {hexid(s.span.span_id): s for s in roles["collective"]}
    for cid, ranks in links_per_collective.items():
        c = collectives[cid]
        assert ranks <= set(c.attributes["fr_otel.collective.entered_ranks"])


def test_grpc_export_of_a_real_hang(hung: Path, tmp_path: Path) -> None:
    """`fr-otel export` over gRPC: one trace, the verdict on the root, every focused entry a span."""
    with OtlpGrpcReceiver() as rx:
        proc = fr_otel("export", str(hung), "--endpoint", rx.url, "--out", str(tmp_path), "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        spans = rx.spans()
    assert out["export"]["status"] == "sent" and out["export"]["spans"] == len(spans)
    assert {hexid(s.span.trace_id) for s in spans} == {out["trace_id"]}
    assert_sound_trace(spans, hung)
    roles = by_role(spans)
    root = roles["incident"][0].attributes
    assert root["fr_otel.verdict"] == "hang" and root["fr_otel.culprit_ranks"] == [3]
    assert root["fr_otel.culprit_kinds"] == ["not_enqueued"]
    assert len(roles["rank"]) == 4
    culprit_rank_span = next(s for s in roles["rank"] if s.attributes["pytorch.distributed.rank"] == 3)
    assert culprit_rank_span.attributes["fr_otel.culprit"] is True
    # The stuck world all_reduce: ranks 0 and 1 entered, 2 and 3 never did.
    stuck = [
        s for s in roles["collective"]
        if s.attributes["pytorch.distributed.pg.desc"] == "default_pg" and s.attributes["fr_otel.collective.missing_ranks"]
    ]
    assert len(stuck) == 1
    assert stuck[0].attributes["fr_otel.collective.entered_ranks"] == [0, 1]
    assert stuck[0].attributes["fr_otel.collective.missing_ranks"] == [2, 3]
    in_flight = [s for s in roles["entry"] if s.attributes.get("fr_otel.in_flight")]
    assert {s.attributes["pytorch.distributed.rank"] for s in in_flight} == {0, 1, 2}
    assert all(any(ev.name == "never completed" for ev in s.span.events) for s in in_flight)


def test_http_export_same_trace_as_grpc(hung: Path, tmp_path: Path) -> None:
    """OTLP/HTTP chosen by the standard variables; re-export gives identical ids."""
    with OtlpGrpcReceiver() as grpc_rx:
        assert fr_otel("export", str(hung), "--endpoint", grpc_rx.url, "--out", str(tmp_path)).returncode == 0
        grpc_ids = sorted(grpc_rx.span_ids())
    with OtlpHttpReceiver() as http_rx:
        env = {
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{http_rx.endpoint}",
            "OTEL_SERVICE_NAME": "my-training-job",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test,team=ml",
        }
        proc = fr_otel("export", str(hung), "--out", str(tmp_path), env=env)
        assert proc.returncode == 0, proc.stderr
        spans = http_rx.spans()
    assert sorted(http_rx.span_ids()) == grpc_ids
    for s in spans:
        res = s.resource_attributes
        assert res["service.name"] == "my-training-job" and res["team"] == "ml"
    instances = {s.resource_attributes["service.instance.id"] for s in by_role(spans)["rank"]}
    assert len(instances) == 4


def test_independent_exports_land_in_one_trace(hung: Path, tmp_path: Path) -> None:
    """Each rank's dump exported by its own process (as each node would) meets in one trace."""
    with OtlpGrpcReceiver() as rx:
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "fr_otel.cli", "export", str(hung / f"rank_{r}"), "--endpoint", rx.url,
                 "--job-id", "run-42", "--out", str(tmp_path)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=CLEAN_ENV,
            )
            for r in range(4)
        ]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        spans = rx.spans()
    assert len(rx.trace_ids()) == 1
    present = {hexid(s.span.span_id) for s in spans}
    entries = by_role(spans)["entry"]
    assert {s.attributes["pytorch.distributed.rank"] for s in entries} == {0, 1, 2, 3}
    for s in entries:
        for link in s.span.links:
            assert hexid(link.span_id) in present
    # Same job id, same dumps, all ranks at once: the same ids again.
    job = build_job(read_dumps(hung))
    together = build_trace(job, analyze(job), TraceOptions(job_id="run-42"))
    assert together.trace_id_hex in rx.trace_ids()
    entry_ids = {hexid(s.span.span_id) for s in entries}
    assert entry_ids <= {f"{s.context.span_id:016x}" for s in together.spans}


def test_embedded_default_file_parses_back(hung: Path, tmp_path: Path) -> None:
    """No endpoint configured: an OTLP JSON Lines file with hex ids that json_format reads back."""
    proc = fr_otel("export", str(hung), "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    path = Path(out["export"]["path"])
    assert out["export"]["status"] == "file" and path.parent == tmp_path
    job = build_job(read_dumps(hung))
    expected = build_trace(job, analyze(job))
    lines = path.read_text().splitlines()
    seen = {}
    for line in lines:
        doc = json.loads(line)
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    assert len(span["traceId"]) == 32 and int(span["traceId"], 16)
                    assert len(span["spanId"]) == 16
                    for link in span.get("links", []):
                        assert len(link["spanId"]) == 16
        # hex ids are the OTLP file format; protobuf's own JSON wants base64: convert and parse.
        from fr_otel.otlp.jsonl import request_from_json

        request = request_from_json(doc)
        data = TracesData(resource_spans=request.resource_spans)
        json_format.MessageToJson(data)  # a valid message
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    seen[span.span_id.hex()] = (span.name, span.start_time_unix_nano, span.end_time_unix_nano)
    want = {f"{s.context.span_id:016x}": (s.name, s.start_time, s.end_time) for s in expected.spans}
    assert seen == want


def test_collector_down_spools_then_replay_delivers_once(hung: Path, tmp_path: Path) -> None:
    """An unbound port: the export ends within its timeout, exit 3, one line; replay delivers exactly once."""
    port = unused_tcp_port()
    start = time.monotonic()
    proc = fr_otel("export", str(hung), "--endpoint", f"http://127.0.0.1:{port}", "--timeout", "3",
                   "--out", str(tmp_path))
    elapsed = time.monotonic() - start
    assert proc.returncode == EXIT_NOT_DELIVERED, proc.stderr
    assert elapsed < 3 + 8  # the deadline plus interpreter start-up on a slow box
    lines = [l for l in proc.stderr.splitlines() if l.startswith("fr-otel:")]
    assert len(lines) == 1 and "spooled to" in lines[0] and "Traceback" not in proc.stderr
    (spool,) = tmp_path.glob("fr-otel-spool-*.jsonl")
    job = build_job(read_dumps(hung))
    expected = {f"{s.context.span_id:016x}" for s in build_trace(job, analyze(job)).spans}
    with OtlpGrpcReceiver() as rx:
        replayed = fr_otel("replay", str(spool), "--endpoint", rx.url)
        assert replayed.returncode == 0, replayed.stderr
        ids = rx.span_ids()
    assert sorted(ids) == sorted(expected)  # every span, exactly once
    assert not spool.exists()  # delivered files are removed


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT])
def test_collector_refusing(hung: Path, tmp_path: Path, code: grpc.StatusCode) -> None:
    """A collector that keeps refusing: bounded time, spool file, exit 3; replay later delivers all."""
    with OtlpGrpcReceiver(always_fail=code) as rx:
        start = time.monotonic()
        proc = fr_otel("export", str(hung), "--endpoint", rx.url, "--timeout", "3", "--out", str(tmp_path))
        elapsed = time.monotonic() - start
        assert proc.returncode == EXIT_NOT_DELIVERED, proc.stderr
        assert elapsed < 3 + 8
        assert rx.failed_calls >= 1 and rx.span_count() == 0
        (spool,) = tmp_path.glob("fr-otel-spool-*.jsonl")
        n_spooled = sum(
            len(ss["spans"]) for line in spool.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
        )
        rx.fail_always(None)
        replayed = fr_otel("replay", str(spool), "--endpoint", rx.url)
        assert replayed.returncode == 0, replayed.stderr
        assert len(rx.span_ids()) == len(set(rx.span_ids())) == n_spooled


def test_chunked_under_a_small_receiver_limit(hung: Path, tmp_path: Path) -> None:
    """--full against a receiver that accepts 16 KiB per message: many requests, none over, all spans once."""
    limit = 16 * 1024
    with OtlpGrpcReceiver(max_receive_message_length=limit) as rx:
        proc = fr_otel("export", str(hung), "--full", "--endpoint", rx.url, "--out", str(tmp_path), "--json")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        sizes = rx.request_sizes
        ids = rx.span_ids()
    assert len(sizes) > 1 and max(sizes) <= limit
    assert len(ids) == len(set(ids)) == out["export"]["spans"]


def test_focus_bounds_the_trace(scenario_dumps) -> None:
    """Default focus keeps in-flight and culprit collectives plus the last N per group per rank;
    older history is summarised on the rank span."""
    folder = scenario_dumps("straggler") / "pickle"
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    full = build_trace(job, verdict, TraceOptions(full=True))
    focused = build_trace(job, verdict, TraceOptions(last_n=2))
    n_entries = sum(len(d.entries) for d in job.dumps.values())
    assert sum(1 for s in full.spans if s.attributes["fr_otel.span"] == "entry") == n_entries
    culprit = verdict.culprits[0].rank
    for s in focused.spans:
        if s.attributes["fr_otel.span"] == "rank":
            rank = s.attributes["pytorch.distributed.rank"]
            groups = s.attributes["fr_otel.history.groups"]
            exported = s.attributes["fr_otel.history.exported_per_group"]
            assert s.attributes["fr_otel.history.entries"] == len(job.dumps[rank].entries)
            if rank != culprit:
                assert all(n <= 2 for n in exported), (groups, exported)
    capped = build_trace(job, verdict, TraceOptions(last_n=5, max_spans=20))
    assert len(capped.spans) < len(focused.spans) + 20 and capped.notes


def test_ids_are_deterministic_and_never_zero(hung: Path) -> None:
    job = build_job(read_dumps(hung))
    verdict = analyze(job)
    a = build_trace(job, verdict, TraceOptions(job_id="x"))
    b = build_trace(build_job(read_dumps(hung)), verdict, TraceOptions(job_id="x"))
    c = build_trace(job, verdict, TraceOptions(job_id="y"))
    assert [s.context.span_id for s in a.spans] == [s.context.span_id for s in b.spans]
    assert a.trace_id == b.trace_id != c.trace_id
    assert all(s.context.span_id and s.context.trace_id for s in a.spans)


def test_sdk_disabled(hung: Path, tmp_path: Path) -> None:
    proc = fr_otel("export", str(hung), "--out", str(tmp_path), env={"OTEL_SDK_DISABLED": "true"})
    assert proc.returncode == 0 and "OTEL_SDK_DISABLED" in proc.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("scenario", ["subgroup_stall", "skip_allreduce"])
def test_spans_are_honest_about_the_stuck_collective(scenario_dumps, scenario: str) -> None:
    """The incident's stuck collective is ERROR on every rank that waits in it (not only after its
    30-minute timeout), in-flight and culprit entries carry code.*, and no completed span of the
    culprit is stretched across the stall by gloo's estimated end."""
    from opentelemetry.trace import StatusCode

    from fr_otel.read.dump import MAX_ESTIMATED_END_NS

    job = build_job(read_dumps(scenario_dumps(scenario) / "pickle"))
    verdict = analyze(job)
    spans = build_trace(job, verdict).spans
    entries = [s for s in spans if s.attributes["fr_otel.span"] == "entry"]
    stuck = {(g.group.name, g.in_flight.seq) for g in verdict.groups if g.in_flight is not None}
    waiting = [s for s in entries if s.attributes.get("fr_otel.in_flight")
               and (s.attributes["pytorch.distributed.pg.name"], s.attributes["pytorch.distributed.collective.seq_id"])
               in stuck]
    assert waiting
    for s in waiting:
        assert s.status.status_code is StatusCode.ERROR and s.attributes["fr_otel.stuck"] is True
        assert s.attributes["error.type"] == "hang" and "waiting for rank(s)" in s.status.description
    culprit = verdict.culprits[0].rank
    culprit_entries = [s for s in entries if s.attributes["pytorch.distributed.rank"] == culprit]
    for s in waiting + culprit_entries:
        assert {"code.function.name", "code.file.path", "code.line.number"} <= set(s.attributes), s.name
        assert "/torch/" not in s.attributes["code.file.path"]
    done = [s for s in culprit_entries if s.attributes["pytorch.distributed.completed"]]
    assert done and all(s.attributes["fr_otel.end_estimated"] for s in done)  # gloo records no completion time
    assert max(s.end_time - s.start_time for s in done) <= MAX_ESTIMATED_END_NS
    # A bound, not a guess: it never ends after the group's next enqueue by any rank.
    nxt = {}
    for s in entries:
        key = (s.attributes["pytorch.distributed.pg.name"], s.attributes["pytorch.distributed.collective.seq_id"])
        nxt[key] = min(nxt.get(key, s.start_time), s.start_time)
    for s in done:
        later = nxt.get((s.attributes["pytorch.distributed.pg.name"],
                         s.attributes["pytorch.distributed.collective.seq_id"] + 1))
        assert later is None or s.end_time <= max(later, s.start_time)
