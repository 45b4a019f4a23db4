#!/usr/bin/env bash
# The GPU path, end to end, on a machine with an NVIDIA GPU: a world-size-1 NCCL job whose all_reduce
# is held on the device by a long kernel (torch.cuda._sleep), so it stays enqueued, not completed.
#   install   a venv with a CUDA torch and fr-otel (pip install -e .), unless --skip-install
#   live      the job under `fr-otel run -- torchrun`: the agent must raise an incident, read the NCCL
#             recorder live and name the culprit `device` (fr-otel analyze --json on the incident folder)
#   watchdog  the same job with a short NCCL timeout and TORCH_NCCL_DUMP_ON_TIMEOUT=1: NCCL's watchdog
#             writes its own dump, which `fr-otel analyze` must read offline
# One PASS/FAIL line per step, then a summary; exit 0 when every step passed, 1 when one failed, 2 on a
# usage error or no GPU. Every step is bounded by `timeout`. --dry-run prints the commands (no GPU needed).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
prog="gpu-check"
job="$root/scripts/gpu_check_job.py"

usage() {
  cat <<EOF
usage: scripts/gpu-check.sh [--venv DIR] [--torch-index URL] [--skip-install] [--system-torch]
                            [--wheels DIR] [--out DIR] [--timeout S] [--dry-run] [-h]

Checks fr-otel's NCCL path on this machine's GPU: the live agent names a device stall, and NCCL's
own watchdog dump reads offline.

  --venv DIR         virtual environment to create or use (default: $default_venv)
  --torch-index URL  pip index of the CUDA torch (default: $default_index)
  --skip-install     use the venv as it is (it must hold a CUDA torch and fr-otel)
  --system-torch     make the venv see the system's packages and keep a CUDA torch found there
                     (a machine whose image has one); only fr-otel is installed
  --wheels DIR       install offline from the wheels in DIR (pip --no-index --find-links DIR)
  --out DIR          where logs, agent output, dumps and analyses go (default: a new folder in \$TMPDIR)
  --timeout S        bound on each check step, in seconds (default: $default_timeout; installs: $install_timeout)
  --dry-run          print the commands it would run, run none (works without a GPU)
  -h, --help         this help

torch version: \$FR_OTEL_TORCH_VERSION (default: $default_torch_version). Python for a new venv: \$PYTHON (default: python3).
EOF
}

usage_error() {
  echo "$prog: $1 (see --help)" >&2
  exit 2
}

default_venv="${XDG_CACHE_HOME:-$HOME/.cache}/fr-otel/gpu-check-venv"
default_index="https://download.pytorch.org/whl/cu128"
default_torch_version="2.13.0"
default_timeout=300
install_timeout=1800

venv="$default_venv"
torch_index="$default_index"
torch_version="${FR_OTEL_TORCH_VERSION:-$default_torch_version}"
skip_install=0
system_torch=0
wheels=""
out=""
step_timeout="$default_timeout"
dry_run=0

while [ $# -gt 0 ]; do
  option="$1"
  case "$option" in
    --venv|--torch-index|--wheels|--out|--timeout)
      [ $# -ge 2 ] && [ -n "$2" ] || usage_error "$option needs a value"
      value="$2"
      shift 2
      ;;
    --venv=*|--torch-index=*|--wheels=*|--out=*|--timeout=*)
      value="${option#*=}"
      option="${option%%=*}"
      [ -n "$value" ] || usage_error "$option needs a value"
      shift
      ;;
    --skip-install) skip_install=1; shift; continue ;;
    --system-torch) system_torch=1; shift; continue ;;
    --dry-run) dry_run=1; shift; continue ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown option: $option" ;;
  esac
  case "$option" in
    --venv) venv="$value" ;;
    --torch-index) torch_index="$value" ;;
    --wheels) wheels="$value" ;;
    --out) out="$value" ;;
    --timeout)
      [[ "$value" =~ ^[1-9][0-9]*$ ]] || usage_error "--timeout needs a whole number of seconds > 0, got '$value'"
      step_timeout="$value"
      ;;
  esac
done

if [ "$dry_run" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "$prog: nvidia-smi not found: this check needs a machine with an NVIDIA GPU (--dry-run shows its commands)" >&2
    exit 2
  fi
  if ! gpus="$(timeout 60 nvidia-smi -L 2>&1)" || [ -z "$gpus" ]; then
    echo "$prog: nvidia-smi -L found no GPU: ${gpus:-no output}" >&2
    exit 2
  fi
  echo "$prog: $gpus" | head -n 1
fi

[ -n "$out" ] || out="${TMPDIR:-/tmp}/fr-otel-gpu-check-$(date +%Y%m%d-%H%M%S)-$$"
[ "$dry_run" = 1 ] || mkdir -p "$out/live" "$out/watchdog/dumps"
out="$(cd "$out" 2>/dev/null && pwd || echo "$out")"
python="$venv/bin/python"
fr_otel="$venv/bin/fr-otel"
torchrun="$venv/bin/torchrun"

show() {  # the command as one line a shell could run again
  printf '+'
  printf ' %q' "$@"
  printf '\n'
}

run() {  # show it; run it unless --dry-run
  show "$@"
  [ "$dry_run" = 1 ] || "$@"
}

run_logged() {  # run_logged LOG CMD...: like run, with its output also in LOG; returns CMD's status
  local log="$1"
  shift
  show "$@"
  [ "$dry_run" = 0 ] || return 0
  set +e
  "$@" 2>&1 | tee "$log"
  local status="${PIPESTATUS[0]}"
  set -e
  return "$status"
}

run_to() {  # run_to FILE CMD...: like run, with its standard output into FILE
  local file="$1"
  shift
  printf '+'
  printf ' %q' "$@"
  printf ' > %q\n' "$file"
  [ "$dry_run" = 1 ] || "$@" > "$file"
}

judge() {  # judge live|offline FILE: the job script's one-line judgement of an analysis, into $found
  show "$python" "$job" --mode "judge-$1" --analysis "$2"
  found="(dry run)"
  [ "$dry_run" = 0 ] || return 0
  found="$(timeout 60 "$python" "$job" --mode "judge-$1" --analysis "$2" 2>&1)"
}

results=()
failed=0
verdict() {  # verdict PASS|FAIL STEP TEXT: one summary line, kept for the end
  local line="$prog: $1 $2: $3"
  echo "$line"
  results+=("$line")
  [ "$1" = PASS ] || failed=$((failed + 1))
}

finish() {
  echo
  if [ "$dry_run" = 1 ]; then
    echo "$prog: dry run: nothing was run (output would go to $out)"
    exit 0
  fi
  echo "$prog: summary (output in $out):"
  local line
  for line in "${results[@]}"; do echo "  $line"; done
  if [ "$failed" -gt 0 ]; then
    echo "$prog: FAIL ($failed of ${#results[@]} steps failed)"
    exit 1
  fi
  echo "$prog: PASS (all ${#results[@]} steps)"
  exit 0
}

# --- install -----------------------------------------------------------------------------------------
pip_from=()
[ -z "$wheels" ] || pip_from=(--no-index --find-links "$wheels")
torch_from=(--index-url "$torch_index")
[ -z "$wheels" ] || torch_from=("${pip_from[@]}")
install_ok=1
if [ "$skip_install" = 1 ]; then
  if [ "$dry_run" = 0 ] && ! { [ -x "$python" ] && [ -x "$fr_otel" ] && [ -x "$torchrun" ]; }; then
    verdict FAIL install "--skip-install, but $venv lacks python, fr-otel or torchrun"
    install_ok=0
  fi
else
  venv_args=()
  [ "$system_torch" = 0 ] || venv_args=(--system-site-packages)
  if [ "$dry_run" = 1 ] || [ ! -x "$python" ]; then
    run timeout "$install_timeout" "${PYTHON:-python3}" -m venv "${venv_args[@]}" "$venv" || install_ok=0
  fi
  has_cuda_torch=0
  if [ "$system_torch" = 1 ] && [ "$dry_run" = 0 ] && [ "$install_ok" = 1 ] \
      && timeout 120 "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    has_cuda_torch=1
    echo "$prog: a CUDA torch is already there: not installing one"
  fi
  if [ "$install_ok" = 1 ] && [ "$has_cuda_torch" = 0 ]; then
    run timeout "$install_timeout" "$python" -m pip install -q "torch==$torch_version" "${torch_from[@]}" \
      || install_ok=0
  fi
  if [ "$install_ok" = 1 ]; then
    build=()
    [ -z "$wheels" ] && [ "$system_torch" = 0 ] || build=(--no-build-isolation)
    run timeout "$install_timeout" "$python" -m pip install -q "${pip_from[@]}" "${build[@]}" -e "$root" \
      || install_ok=0
  fi
  if [ "$dry_run" = 0 ] && [ "$install_ok" = 0 ]; then
    verdict FAIL install "pip or venv failed (its output is above)"
  fi
fi
if [ "$dry_run" = 0 ] && [ "$install_ok" = 1 ]; then
  if about="$(timeout 120 "$python" -W ignore -c 'import torch, fr_otel
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}), fr-otel {fr_otel.__version__}")' 2>&1)" \
      && [[ "$about" == *"available: True"* ]]; then
    verdict PASS install "$about"
  else
    verdict FAIL install "no CUDA torch with fr-otel in $venv: $about"
    install_ok=0
  fi
fi
if [ "$install_ok" = 0 ]; then
  verdict FAIL live "not run: install failed"
  verdict FAIL watchdog "not run: install failed"
  finish
fi

# analyze_and_judge MODE FOLDER INPUT: `fr-otel analyze` (text and --json) of INPUT into FOLDER, then the judge.
analyze_and_judge() {
  run_logged "$2/analyze.log" timeout "$step_timeout" "$fr_otel" analyze "$3" \
    && run_to "$2/analysis.json" timeout "$step_timeout" "$fr_otel" analyze --json "$3" \
    && judge "$1" "$2/analysis.json"
}

# --- live: the agent raises the incident and names the device ------------------------------------------
live="$out/live"
agent_out="$live/fr-otel-out"
echo
echo "$prog: live: the agent in a 1-rank NCCL job whose all_reduce is held on the device for 40 s"
live_status=0
run_logged "$live/job.log" timeout --kill-after=30 "$step_timeout" env \
  FR_OTEL_STALL_SECONDS=5 FR_OTEL_OUT_DIR="$agent_out" FR_OTEL_DUMP_DIR="$agent_out/dumps" \
  FR_OTEL_METRICS_PORT=0 FR_OTEL_LOG_LEVEL=info FR_OTEL_GATHER_SECONDS=10 \
  TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_ENABLE_MONITORING=1 PYTHONUNBUFFERED=1 \
  "$fr_otel" run -- "$torchrun" --standalone --nproc-per-node 1 "$job" --mode live --hold-s 40 --timeout-s 600 \
  || live_status=$?
if [ "$dry_run" = 1 ]; then
  incident="$agent_out/dumps/<trace id>"
else
  incident_file="$(find "$agent_out" -name incident.json -print -quit 2>/dev/null || true)"
  incident="${incident_file%/incident.json}"
fi
if [ "$dry_run" = 0 ] && [ -z "${incident_file:-}" ]; then
  verdict FAIL live "no incident raised: no incident.json under $agent_out (job exit $live_status; log $live/job.log)"
elif found="fr-otel analyze failed on $incident" && analyze_and_judge live "$live" "$incident"; then
  [ "$dry_run" = 1 ] || verdict PASS live "incident in $incident (job exit $live_status): ${found#*ok: }"
else
  verdict FAIL live "$found"
fi

# --- watchdog: NCCL's own dump, read offline ------------------------------------------------------------
wd="$out/watchdog"
dumps="$wd/dumps"
echo
echo "$prog: watchdog: the same job, NCCL timeout 10 s, no agent: the watchdog writes its dump"
wd_status=0
run_logged "$wd/job.log" timeout --kill-after=30 "$step_timeout" env \
  TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_TRACE_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
  TORCH_NCCL_ENABLE_MONITORING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=3 \
  TORCH_FR_DUMP_TEMP_FILE="$dumps/nccl_trace_rank_" TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$dumps/nccl_trace_rank_" \
  PYTHONUNBUFFERED=1 \
  "$torchrun" --standalone --nproc-per-node 1 "$job" --mode watchdog --timeout-s 10 --hold-s 120 \
  || wd_status=$?
if [ "$dry_run" = 0 ] && [ ! -s "$dumps/nccl_trace_rank_0" ]; then
  verdict FAIL watchdog "no watchdog dump at $dumps/nccl_trace_rank_0 (job exit $wd_status; log $wd/job.log)"
elif found="fr-otel analyze failed on $dumps" && analyze_and_judge offline "$wd" "$dumps"; then
  [ "$dry_run" = 1 ] || verdict PASS watchdog "dump read offline (job exit $wd_status): ${found#*ok: }"
else
  verdict FAIL watchdog "$found"
fi

finish
