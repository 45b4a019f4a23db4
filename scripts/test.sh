#!/usr/bin/env bash
# Set up (if needed), type-check src/ (mypy) and run the whole test suite. Extra arguments go to pytest.
# --fast (first): only the tests that start no real job and no lab (every test that starts one is marked gloo,
# the lab's too) and spend no quarter-minute of CPU alone (marked slow), the inner loop of under three minutes;
# the rest needs the full run.
set -euo pipefail
select=()
workers=(-n auto --maxprocesses 4)
if [ "${1:-}" = "--fast" ]; then
  shift
  # Four workers even on two cores: the fast tier waits more than it computes (stores frozen on purpose,
  # incident budgets run out, Prometheus started): 216 s with two workers, 191 s with four, on the idle box.
  select=(-m "not gloo and not slow")
  workers=(-n 4)
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup-system.sh"  # first: the compiler setup.sh's install builds with
"$root/scripts/setup.sh"
cd "$root"
# The type checker first ([tool.mypy] in pyproject.toml: strict on src/): a type error fails the run
# before the suite's minutes are spent. Its cache lives in the venv, not in the checkout.
if ! "$root/.venv/bin/python" -m mypy --cache-dir "$root/.venv/.mypy_cache"; then
  echo "fr-otel: mypy found type errors (above): fix them, the suite did not run" >&2
  exit 1
fi
# Bytecode caches on, whatever the machine sets (some CI images export PYTHONDONTWRITEBYTECODE=1): the
# suite starts hundreds of Python processes (ranks' agents, CLI runs), and without caches each one
# compiles fr-otel's modules anew (~0.3 s of CPU each). __pycache__ is ignored by git and by the
# checkout guard.
unset PYTHONDONTWRITEBYTECODE
set +e
# On every core (at most 4 workers): the real jobs mostly wait on timeouts, so a second worker runs other
# tests meanwhile. Tests marked `lab` share one xdist group (tests/conftest.py): one lab at a time.
# A later `-n 0` among the arguments runs everything in this process.
"$root/.venv/bin/python" -m pytest -q "${workers[@]}" --dist loadgroup ${select[@]+"${select[@]}"} "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "fr-otel: pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit "$rc"
