#!/usr/bin/env bash
# System packages: a C compiler and the Python headers (the compiled column scan), and what the
# test suite drives for real: Prometheus + promtool (Debian's
# prometheus), amtool (prometheus-alertmanager) and headless Chromium. Installed only when missing; needs root (CI is).
set -euo pipefail
need=()
# A C compiler and the Python headers build the optional compiled column scan (pip install).
command -v cc >/dev/null 2>&1 || need+=(gcc)
py_include="$("${PYTHON:-python3}" -c 'import sysconfig; print(sysconfig.get_path("include"))' 2>/dev/null || true)"
[ -n "$py_include" ] && [ -f "$py_include/Python.h" ] || need+=(python3-dev)
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  echo "fr-otel setup: installing ${need[*]} (Debian packages)" >&2
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian starts services on install; tests start their own on free ports.
for svc in prometheus prometheus-alertmanager; do
  if command -v systemctl >/dev/null 2>&1; then systemctl stop "$svc" >/dev/null 2>&1 || true; fi
  if command -v service >/dev/null 2>&1; then service "$svc" stop >/dev/null 2>&1 || true; fi
done
