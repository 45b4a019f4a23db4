#!/usr/bin/env bash
# Set up (if needed) and run the main job: a real 4-rank gloo job on CPU under
# `fr-otel run -- torchrun`, one rank's data loader stalls; the live agent names it
# (host, step, first to stop, where it is now), /metrics shows it, the trace and the
# HTML report are written; then the job is stopped. Flags: fr-otel demo --help.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "$root/.venv/bin/fr-otel" demo "$@"
