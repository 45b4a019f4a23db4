#!/usr/bin/env bash
# Set up (if needed) and run the main job: a real gloo job on CPU in which one
# rank hangs, every rank's Flight Recorder captured, analysed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
exec "$root/.venv/bin/fr-otel" demo "$@"
