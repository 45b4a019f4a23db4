"""The testing kit shipped to users for testing their own set-ups; each is imported from its module.

- ``dump_builder``: hand-built NCCL/gloo dumps (pickle or JSON) for specification tests
- ``otlp``: real OTLP/gRPC and OTLP/HTTP receivers on loopback ("test your setup")
- ``spans``: deterministic synthetic spans to export (or to smoke-test a real collector)

This suite's own machinery (a Prometheus launcher, the torchrun training loop) lives in
``tests/support/``, not in the wheel; real gloo hangs come from :mod:`fr_otel.scenarios`.
"""

from __future__ import annotations

__all__: list[str] = []  # nothing here: the modules differ in what they import (grpc, torch)
