#!/usr/bin/env bash
# Set up a fresh machine for fr-otel: a virtual environment in .venv with the
# package, the torch extra (torch 2.13.0 CPU), the launchers the tests run (Lightning, Accelerate) and the test tools. Idempotent and
# quick when nothing changed (a stamp of pyproject.toml, setup.py and the C sources).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
PYTHON="${PYTHON:-python3}"
venv="$root/.venv"
stamp="$venv/.fr-otel-setup"
# The compiled extensions (column scan, pickle key walk) are built by the editable install: a change
# to one must reinstall too.
want="$(cat pyproject.toml setup.py src/fr_otel/read/*.c | sha256sum | cut -d' ' -f1)"
if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "fr-otel setup: creating $venv (one-off; torch is a large download if not cached)" >&2
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
# Pin torch first, and hold it pinned (a constraints file) while the rest installs: an unpinned range, or a
# launcher's own torch requirement (Lightning, Accelerate), would pull a multi-GB CUDA build.
torch_pin="torch==${FR_OTEL_TORCH_VERSION:-2.13.0}"
"$venv/bin/python" -m pip install -q "$torch_pin"
echo "$torch_pin" > "$venv/constraints.txt"
"$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" -e ".[torch,test,launchers]"
echo "$want" > "$stamp"
