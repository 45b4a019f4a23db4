"""Helpers shipped to users for testing their own set-ups; each is imported from its module.

- ``dump_builder``: hand-built NCCL/gloo dumps (pickle or JSON) for specification tests
- ``gloo_jobs``: real gloo hangs on CPU frozen into dumps (the :mod:`fr_otel.scenarios` jobs)
- ``otlp``: real OTLP/gRPC and OTLP/HTTP receivers on loopback
- ``spans``: deterministic synthetic spans to export (or to smoke-test a real collector)
- ``prometheus``: a real Prometheus on loopback, queried over its HTTP API
- ``ports``: free loopback ports
- ``train_loop``: a small CPU gloo training loop for torchrun, one rank stalling on request
"""

from __future__ import annotations

__all__: list[str] = []  # nothing here: the modules differ in what they import (grpc, torch)
