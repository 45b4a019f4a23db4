#!/usr/bin/env python3
"""Export cost, measured side by side in one run (these machines are noisy).

1. Dumps on disk -> focused trace accepted by a local OTLP/gRPC receiver
   (`fr-otel export DIR --endpoint ...`), next to the analysis alone
   (`fr-otel analyze DIR --json`), each a fresh process, interleaved, median of
   ``--reps``. Target: export adds <= 50 % to the analysis.
2. ``--full`` throughput: spans/s from the analysed job to spans accepted by the receiver
   (build the spans, encode them directly, chunk, send, accepted), next to the SDK's bare
   ``encode_spans`` of the same spans (encoding alone, nothing built or sent), in one
   process, interleaved, ``--reps`` times. Target: end to end at >= 1.0x the speed of the
   bare SDK encoding. The direct encoder's bytes are checked equal to the SDK's.

    python bench/bench_export.py                # 1024 x 2000 and a --full run on 64 x 2000
    python bench/bench_export.py --quick        # 64 x 2000, --full on 16 x 2000
    python bench/bench_export.py --full-only    # only the --full throughput (64 x 2000)
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_analyze import _fr_otel_cmd, measure  # noqa: E402
from make_scaled_dumps import default_out, generate  # noqa: E402
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans  # noqa: E402

from fr_otel import analyze, build_job, read_dumps  # noqa: E402
from fr_otel.incident.sinks import sink_for  # noqa: E402
from fr_otel.otlp.config import resolve_export_config  # noqa: E402
from fr_otel.otlp.encode import encode_request  # noqa: E402
from fr_otel.testing.otlp import OtlpGrpcReceiver  # noqa: E402
from fr_otel.trace.spans import TraceOptions, build_trace  # noqa: E402


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


def full(ranks: int, entries: int, reps: int) -> None:
    folder = default_out(ranks, entries)
    generate(ranks, entries, folder)
    job = build_job(read_dumps(folder))
    verdict = analyze(job)
    ends, sdk, direct = [], [], []
    n = size = 0
    with OtlpGrpcReceiver() as rx:
        config = resolve_export_config(endpoint=rx.url, environ={})
        for _ in range(reps):
            rx.clear()
            gc.collect()
            t0 = time.perf_counter()
            trace = build_trace(job, verdict, TraceOptions(full=True))
            outcome = sink_for(config, "/tmp/fr-otel-bench/out").deliver(trace, deadline_s=300)
            ends.append(time.perf_counter() - t0)
            n = len(trace.spans)
            assert outcome.status == "sent" and rx.span_count() == n, (outcome, rx.span_count(), n)
            t0 = time.perf_counter()
            reference = encode_spans(trace.spans).SerializeToString()
            sdk.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            mine = encode_request(trace.spans)
            direct.append(time.perf_counter() - t0)
            assert mine == reference, "direct encoder bytes differ from encode_spans"
            size = len(reference)
            del trace, reference, mine
    ratios = [s / e for s, e in zip(sdk, ends)]
    med = statistics.median
    print(f"--full {ranks} x {entries}: {n} spans ({size / 2**20:.0f} MiB OTLP), median of {reps}:\n"
          f"  end to end (build spans + direct encode + chunk + send + accepted) {med(ends):.2f} s "
          f"-> {n / med(ends):,.0f} spans/s  [runs {[round(x, 2) for x in ends]}]\n"
          f"  bare SDK encode_spans of the same spans {med(sdk):.2f} s -> {n / med(sdk):,.0f} spans/s  "
          f"[runs {[round(x, 2) for x in sdk]}]\n"
          f"  direct encoder alone {med(direct):.2f} s -> {n / med(direct):,.0f} spans/s (same bytes as the SDK)\n"
          f"  end-to-end speed / bare encode_spans speed = {med(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}] "
          f"(target >= 1.0x) {'MET' if med(ratios) >= 1.0 else 'MISSED'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 x 2000 only")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--full-only", action="store_true", help="only the --full throughput part")
    args = ap.parse_args()
    if not args.full_only:
        focused(64, 2000, args.reps) if args.quick else focused(1024, 2000, args.reps)
    full(16 if args.quick else 64, 2000, args.reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
