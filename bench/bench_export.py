#!/usr/bin/env python3
"""Export cost, measured side by side in one run (these machines are noisy).

1. Dumps on disk -> focused trace accepted by a local OTLP/gRPC receiver
   (`fr-otel export DIR --endpoint ...`), next to the analysis alone
   (`fr-otel analyze DIR --json`), each a fresh process, interleaved, median of
   ``--reps``. Target: export adds <= 50 % to the analysis.
2. ``--full`` throughput: spans/s from dumps to spans accepted by the receiver, next
   to bare protobuf encoding of the same spans (``encode_spans``), in one process.

    python bench/bench_export.py                # 1024 x 2000 and a --full run on 64 x 2000
    python bench/bench_export.py --quick        # 64 x 2000 only
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analyze import _fr_otel_cmd, measure  # noqa: E402
from make_scaled_dumps import default_out, generate  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

from fr_otel import analyze, build_job, read_dumps  # noqa: E402
from fr_otel.incident_export import deliver_trace  # noqa: E402
from fr_otel.otlp_config import resolve_export_config  # noqa: E402
from fr_otel.spans import TraceOptions, build_trace  # noqa: E402
from fr_otel.testing.otlp import OtlpGrpcReceiver  # noqa: E402


def focused(ranks: int, entries: int, reps: int) -> None:
    folder = default_out(ranks, entries)
    generate(ranks, entries, folder)
    cmd = _fr_otel_cmd()
    analysis, export, spans = [], [], 0
    with OtlpGrpcReceiver() as rx:
        for _ in range(reps):
            a = measure([*cmd, "analyze", str(folder), "--json"], 900)
            assert a.rc == 0, a.stderr[-500:]
            rx.clear()
            e = measure([*cmd, "export", str(folder), "--endpoint", rx.url, "--out", "/tmp/fr-otel-bench/out",
                         "--json"], 900)
            assert e.rc == 0, e.stderr[-500:]
            spans = rx.span_count()
            analysis.append(a.wall_s)
            export.append(e.wall_s)
    a_med, e_med = statistics.median(analysis), statistics.median(export)
    print(f"{ranks} x {entries}: analyze {a_med:.2f} s, export (focused trace accepted, {spans} spans) "
          f"{e_med:.2f} s -> export adds {100 * (e_med / a_med - 1):.0f} % (target <= 50 %)  "
          f"[runs: analyze {[round(x, 2) for x in analysis]}, export {[round(x, 2) for x in export]}]")


def full(ranks: int, entries: int) -> None:
    folder = default_out(ranks, entries)
    generate(ranks, entries, folder)
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    t0 = time.perf_counter()
    trace = build_trace(job, verdict, TraceOptions(full=True))
    t_build = time.perf_counter() - t0
    n = len(trace.spans)
    t0 = time.perf_counter()
    request = encode_spans(trace.spans)
    t_encode = time.perf_counter() - t0
    size = request.ByteSize()
    with OtlpGrpcReceiver() as rx:
        config = resolve_export_config(endpoint=rx.url, environ={})
        t0 = time.perf_counter()
        outcome = deliver_trace(trace, config, directory="/tmp/fr-otel-bench/out", deadline_s=300)
        t_send = time.perf_counter() - t0
        got = rx.span_count()
    assert outcome.status == "sent" and got == n, (outcome, got, n)
    total = t_build + t_send
    print(f"--full {ranks} x {entries}: {n} spans ({size / 2**20:.0f} MiB OTLP): build {t_build:.2f} s, "
          f"encode+chunk+send+accept {t_send:.2f} s -> {n / total:,.0f} spans/s end to end; bare protobuf "
          f"encoding alone {t_encode:.2f} s -> {n / t_encode:,.0f} spans/s (ratio {total / t_encode:.1f}x)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 x 2000 only")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    focused(64, 2000, args.reps) if args.quick else focused(1024, 2000, args.reps)
    full(64, 2000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
