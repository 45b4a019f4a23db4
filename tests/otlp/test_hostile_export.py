"""Export facing hostile collectors and settings: partial success counted, bad settings one line before dialling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.hostile_dumps import cli, write_job

from fr_otel.otlp.chunks import to_requests
from fr_otel.otlp.config import resolve_export_config
from fr_otel.testing.otlp import OtlpGrpcReceiver, OtlpHttpReceiver


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_receiver_rejecting_half_the_spans_makes_export_say_so_and_exit_3(
    job_folder: Path, tmp_path: Path, protocol: str
) -> None:
    """Partial success is not delivery: the count of rejected spans is printed, exit 3."""
    receiver = OtlpGrpcReceiver if protocol == "grpc" else OtlpHttpReceiver
    with receiver(reject_fraction=0.5) as rx:
        proc = cli("export", str(job_folder), "--endpoint", rx.url, "--protocol", protocol, "--out",
                   str(tmp_path / "out"), "--json")
        rejected = rx.rejected_spans
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    total = doc["export"]["spans"]
    assert rejected == total // 2 and doc["export"]["spans_rejected"] == rejected
    assert doc["export"]["status"] == "partial"
    assert f"only {total - rejected} of {total} spans delivered" in proc.stderr
    assert f"collector rejected {rejected} of {total} spans" in proc.stderr


def test_partial_success_over_http_json_is_counted(tmp_path: Path) -> None:
    """The OTLP/JSON body's partialSuccess is read too."""
    from fr_otel.otlp.export import export_spans
    from fr_otel.testing.spans import synthetic_spans

    with OtlpHttpReceiver(reject_fraction=0.5) as rx:
        config = resolve_export_config(endpoint=rx.url, protocol="http/json", environ={})
        result = export_spans(synthetic_spans(100), config, deadline_s=10, spool_dir=tmp_path)
    assert result.spans_rejected == 50 and result.spans_sent == 50 and not result.ok
    assert "collector rejected 50 of 100 spans" in (result.error or "")


@pytest.mark.parametrize(("flags", "env", "words"), [
    (["--endpoint", "ftp://host:21"], {}, "host:port or http[s]://host:port"),
    (["--endpoint", "host:notaport"], {}, "port must be a number from 1 to 65535"),
    (["--endpoint", "host:99999"], {}, "port must be a number from 1 to 65535"),
    (["--endpoint", "not_a_url"], {}, "needs a port"),
    (["--endpoint", "http://127.0.0.1:-1"], {}, "port must be a number"),
    ([], {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:99999"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
    (["--endpoint", "127.0.0.1:4317", "--headers", "auth=a%0Ab"], {}, "control characters"),
    ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_CERTIFICATE": "@CERT@"},
     "not usable PEM"),
])
def test_bad_endpoint_settings_are_one_line_and_exit_2_before_dialling(
    job_folder: Path, tmp_path: Path, flags: list[str], env: dict[str, str], words: str
) -> None:
    """Flags and OTEL_* alike: one line, exit 2, fast (nothing was dialled or retried)."""
    cert = tmp_path / "ca.pem"
    cert.write_text("not a certificate\n")
    env = {k: v.replace("@CERT@", str(cert)) for k, v in env.items()}
    began = time.monotonic()
    proc = cli("export", str(job_folder), "--out", str(tmp_path / "out"), *flags, env=env, timeout=30)
    assert proc.returncode == 2 and time.monotonic() - began < 15, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_failed_spool_rewrite_counts_the_delivered_spans_still_in_it(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """If replay cannot rewrite a partly delivered file, it says those spans are still there."""
    from fr_otel.otlp import export as otlp_export
    from fr_otel.otlp.chunks import chunk_requests
    from fr_otel.otlp.jsonl import write_jsonl
    from fr_otel.testing.spans import synthetic_spans

    spool = write_jsonl(tmp_path / "spool.jsonl", chunk_requests(
        to_requests(synthetic_spans(200)), 4096))
    with OtlpGrpcReceiver() as rx:
        rx.fail_next(*([None] * 3), *([__import__("grpc").StatusCode.INVALID_ARGUMENT] * 200))

        def failing_rewrite(*args: Any, **kwargs: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(otlp_export, "write_jsonl", failing_rewrite)
        config = resolve_export_config(endpoint=rx.url, environ={}, max_request_bytes=4096)
        result = otlp_export.replay([spool], config, deadline_s=10, remove_on_success=True)
    assert result.spans_sent > 0 and result.spans_spooled == 200
    assert f"its {result.spans_sent} delivered spans" in (result.error or "")


def test_a_ca_file_that_is_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO blocks until a writer comes: the CA file is stat'ed first, one line, exit 2."""
    dumps = write_job(tmp_path / "dumps")
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    result = subprocess.run(
        [sys.executable, "-m", "fr_otel.cli", "export", str(dumps), "--endpoint", "https://127.0.0.1:1"],
        capture_output=True, text=True, timeout=20, env={**os.environ, "OTEL_EXPORTER_OTLP_CERTIFICATE": str(fifo)})
    assert result.returncode == 2 and "not a regular file" in result.stderr
