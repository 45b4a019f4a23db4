#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-system.sh"  # first: the compiler setup.sh's install builds with
"$root/scripts/setup.sh"
cd "$root"
set +e
"$root/.venv/bin/python" -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "fr-otel: pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
