#!/usr/bin/env bash
# Read-only check of the NVML backend on a machine with an NVIDIA GPU.
#
# Builds runtimekit-resource-layer (debug, or release with --release) and runs its probe:
# discovery (index, UUID, model, memory, PCI), topology (PCIe switch, NUMA, socket, CPU affinity,
# NVLink, common ancestors, RDMA NICs), MIG mode and instances, metrics with processes, and the
# health read-out. The probe only reads: it changes no MIG mode and creates or destroys no
# instance. When nvidia-smi is there, the script checks that itself by comparing the MIG mode
# and the GPU/compute instances before and after, and that the probe found every card.
#
# On a machine without an NVIDIA GPU it says so and exits 0.
#
# Usage: e2e/gpu-check.sh [--release]
#   RL_BIN=/path/to/runtimekit-resource-layer  use this binary instead of building one
#   RL_HEALTH_WAIT_MS=3000                     how long the probe watches for XID events
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
case "${1:-}" in
  --release) profile=release ;;
  "") ;;
  *) echo "usage: $0 [--release]" >&2; exit 2 ;;
esac

smi() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi "$@"; }

if ! smi -L >/dev/null 2>&1 && ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
  echo "gpu-check: no NVIDIA GPU on this machine (no working nvidia-smi, no /dev/nvidia*); nothing to check."
  exit 0
fi

if [[ -n "${RL_BIN:-}" ]]; then
  bin="$RL_BIN"
else
  echo "gpu-check: building runtimekit-resource-layer ($profile)"
  if [[ "$profile" == release ]]; then
    cargo build --release --locked -p runtimekit-resource-layer
  else
    cargo build --locked -p runtimekit-resource-layer
  fi
  bin="${CARGO_TARGET_DIR:-target}/$profile/runtimekit-resource-layer"
fi
[[ -x "$bin" ]] || { echo "gpu-check: no binary at $bin" >&2; exit 1; }

mig_state() {
  # MIG mode per card, then the GPU and compute instances (nvidia-smi prints an error line
  # on cards without MIG; that line is part of the state and must not change either).
  smi --query-gpu=index,uuid,mig.mode.current,mig.mode.pending --format=csv,noheader 2>&1 || true
  smi mig -lgi 2>&1 || true
  smi mig -lci 2>&1 || true
}

before="$(mig_state)"
echo "gpu-check: nvidia-smi before the probe:"
smi -L 2>&1 || echo "  (nvidia-smi not available)"
echo "$before" | sed 's/^/  /'

echo
echo "gpu-check: running $bin probe --backend nvml"
echo "------------------------------------------------------------------------"
errfile="$(mktemp)"
trap 'rm -f "$errfile"' EXIT
set +e
report="$("$bin" probe --backend nvml --node-name "$(hostname)" \
  --health-wait-ms "${RL_HEALTH_WAIT_MS:-3000}" 2>"$errfile")"
rc=$?
set -e
echo "$report"
echo "------------------------------------------------------------------------"
if [[ -s "$errfile" ]]; then
  echo "gpu-check: probe log:"
  sed 's/^/  /' "$errfile"
fi

after="$(mig_state)"
status=0
if [[ $rc -ne 0 ]]; then
  echo "gpu-check: FAIL: the probe exited with $rc"
  status=1
fi
if [[ "$before" != "$after" ]]; then
  echo "gpu-check: FAIL: the MIG state changed during a read-only probe:"
  diff <(echo "$before") <(echo "$after") || true
  status=1
else
  echo "gpu-check: MIG mode and instances unchanged"
fi
if command -v nvidia-smi >/dev/null 2>&1 && [[ $rc -eq 0 ]]; then
  while read -r uuid; do
    [[ -z "$uuid" ]] && continue
    if grep -q -- "$uuid" <<<"$report"; then
      echo "gpu-check: found $uuid"
    else
      echo "gpu-check: FAIL: nvidia-smi lists $uuid, the probe does not"
      status=1
    fi
  done < <(smi --query-gpu=uuid --format=csv,noheader 2>/dev/null || true)
fi
if [[ $status -eq 0 ]]; then
  echo "gpu-check: OK"
fi
exit $status
