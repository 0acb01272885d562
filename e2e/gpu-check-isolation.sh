#!/usr/bin/env bash
# The isolation library on a machine with an NVIDIA card: the memory cap against the real driver.
#
# Runs prebuilt files only (never builds or downloads: the machine may have nothing but the
# driver): `runtimekit-cuda-probe`, `libruntimekit_isolation.so` and `runtimekit-resource-layer`,
# built elsewhere with
# `./just gpu-check-build` and carried over. On card 0, with the library preloaded and the
# environment lj-runtime sets for a slice of 4 GiB:
#   - without the library a 5 GiB allocation succeeds (so every refusal below is the library's);
#   - under the cap 5 GiB fails with CUDA_ERROR_OUT_OF_MEMORY and 3 GiB succeeds, through
#     cuMemAlloc and the virtual-memory API (cuMemCreate), found by dlsym, cuGetProcAddress_v2
#     and cuGetProcAddress;
#   - every other allocation path (pitch, managed, async, async per-thread, pool, arrays,
#     mipmapped arrays, the 32-bit cuMemAlloc) takes 2 GiB twice and is refused the third time;
#   - cuMemGetInfo, cuDeviceTotalMem and NVML's nvmlDeviceGetMemoryInfo_v2 report 4 GiB;
#   - two processes share the cap: with 3 GiB held by one, the other is refused 2 GiB and
#     given 1 GiB, and once the holder is killed without freeing, 4 GiB fits again.
# Then, with kernels the probe hands the driver as PTX text:
#   - launch overhead: the mean time of one launch, without the library and through its launch
#     gate (a compute cap set, no measurement closing the gate);
#   - fault containment: a process of one capped container stores to an illegal address while a
#     neighbour container's process runs kernels; the neighbour must finish without an error;
#   - time-slicing without a compute cap: each of two processes running kernels side by side
#     gets about half of what it gets alone;
#   - the compute cap: with the resource layer's compute meter feeding the launch gates NVML's
#     per-process readings, two processes capped at 30 % and 70 % get SM time within 10 % of
#     3:7 (and what metering costs the resource layer).
# It changes no MIG or compute mode. Exits non-zero when there is no GPU or any check fails.
#
# Usage: e2e/gpu-check-isolation.sh [BIN_DIR]     (default: target/gpu-check)
set -uo pipefail

bin_dir="${1:-$(dirname "$0")/../target/gpu-check}"
probe="$bin_dir/runtimekit-cuda-probe"
library="$(cd "$bin_dir" 2>/dev/null && pwd)/libruntimekit_isolation.so"
failures=0
say() { echo "gpu-check-isolation: $*"; }
fail() { echo "gpu-check-isolation: FAIL: $*"; failures=$((failures + 1)); }
bounded() { timeout --kill-after=5 60 "$@"; }

if [[ ! -x "$probe" || ! -f "$library" || ! -x "$bin_dir/runtimekit-resource-layer" ]]; then
  echo "gpu-check-isolation: no probe, library or resource layer in $bin_dir; build them with ./just gpu-check-build (on any machine) and carry $bin_dir here" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! bounded nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu-check-isolation: FAIL: no NVIDIA GPU answers here (nvidia-smi -L fails)" >&2
  exit 1
fi
uuid="$(bounded nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)"
ledger="$(mktemp -d)"
holder_pid=""
layer_pid=""
meter_state=""
cleanup() {
  [[ -n "$holder_pid" ]] && kill -9 "$holder_pid" 2>/dev/null
  [[ -n "$layer_pid" ]] && kill "$layer_pid" 2>/dev/null
  rm -rf "$ledger" ${meter_state:+"$meter_state"}
}
trap cleanup EXIT
say "card 0: $uuid, capped at 4096 MiB"

# capped COMMAND...: COMMAND under timeout(1), as a process of the capped container.
capped() {
  env LD_PRELOAD="$library" RUNTIMEKIT_VISIBLE_DEVICES="$uuid" \
    RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096 RUNTIMEKIT_ISOLATION_DIR="$ledger" \
    timeout --kill-after=5 60 "$@"
}
# results VIA PATH MIB COUNT [capped]: the probe's results, space-separated.
results() {
  local via=$1 path=$2 mib=$3 count=$4 wrap=${5:-capped}
  if [[ "$wrap" == capped ]]; then
    capped "$probe" --via "$via" alloc --path "$path" --mib "$mib" --count "$count" 2>&1
  else
    bounded "$probe" --via "$via" alloc --path "$path" --mib "$mib" --count "$count" 2>&1
  fi | sed -n 's/^allocation [0-9]* of [0-9]*: //p' | tr '\n' ' ' | sed 's/ $//'
}
expect() {
  local what=$1 got=$2 want=$3
  if [[ "$got" == "$want" ]]; then
    say "ok: $what: $got"
  else
    fail "$what: got '$got', want '$want'"
  fi
}

expect "5 GiB without the library" "$(results dlsym alloc 5120 1 free)" "ok"
for via in dlsym proc-address proc-address-v1; do
  for path in alloc vmm; do
    expect "5 GiB by $path via $via" "$(results "$via" "$path" 5120 1)" "error 2"
    expect "3 GiB by $path via $via" "$(results "$via" "$path" 3072 1)" "ok"
  done
done
for path in pitch managed async async-ptsz pool array array3d mipmapped; do
  expect "2 GiB three times by $path" "$(results proc-address "$path" 2048 3)" "ok ok error 2"
done
# The 32-bit cuMemAlloc: driver 580 refuses it on a context of the current API (201,
# CUDA_ERROR_INVALID_CONTEXT), the fake driver serves it; either way it must not pass the cap.
legacy="$(results dlsym alloc-v1 2048 3)"
if [[ "$legacy" == "ok ok error 2" || "$legacy" == "error 201 error 201 error 201" ]]; then
  say "ok: 2 GiB three times by alloc-v1: $legacy"
else
  fail "2 GiB three times by alloc-v1: got '$legacy'"
fi

info="$(capped "$probe" info 2>&1)"
expect "memory queries" "$info" "free 4294967296 total 4294967296 device_total 4294967296"
expect "NVML's memory query" "$(capped "$probe" nvml-memory 2>&1)" "total 4294967296 used 0 free 4294967296"

# Not under timeout(1): the pid killed below must be the probe's own.
env LD_PRELOAD="$library" RUNTIMEKIT_VISIBLE_DEVICES="$uuid" RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096 \
  RUNTIMEKIT_ISOLATION_DIR="$ledger" "$probe" hold --mib 3072 --seconds 120 >"$ledger/hold.out" 2>&1 &
holder_pid=$!
for _ in $(seq 1 100); do
  grep -q '^holding' "$ledger/hold.out" 2>/dev/null && break
  kill -0 "$holder_pid" 2>/dev/null || break
  sleep 0.2
done
if grep -q '^holding' "$ledger/hold.out"; then
  expect "2 GiB beside 3 GiB held by another process" "$(results dlsym alloc 2048 1)" "error 2"
  expect "1 GiB beside 3 GiB held by another process" "$(results dlsym alloc 1024 1)" "ok"
  kill -9 "$holder_pid"
  wait "$holder_pid" 2>/dev/null
  holder_pid=""
  expect "4 GiB once the holder was killed" "$(results dlsym alloc 4096 1)" "ok"
else
  fail "the holder did not hold 3 GiB: $(cat "$ledger/hold.out")"
fi

# number FIELD TEXT: the value after FIELD in TEXT.
number() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p" <<<"$2" | head -1; }

plain="$(bounded "$probe" launch-overhead 2>&1)"
# With a compute cap, so every launch passes the gate (open: nothing writes measurements here).
wrapped="$(RUNTIMEKIT_GPU_CORE_LIMIT=30 capped "$probe" launch-overhead 2>&1)"
say "launch overhead: $(number launch_us "$plain") us without the library, $(number launch_us "$wrapped") us through its launch gate"
[[ -n "$(number launch_us "$wrapped")" ]] || fail "launch overhead: $plain / $wrapped"

neighbour_ledger="$(mktemp -d)"
env LD_PRELOAD="$library" RUNTIMEKIT_VISIBLE_DEVICES="$uuid" RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096 \
  RUNTIMEKIT_ISOLATION_DIR="$neighbour_ledger" timeout 60 "$probe" spin --seconds 8 >"$ledger/spin.out" 2>&1 &
spinner=$!
sleep 2
poisoned="$(capped "$probe" poison 2>&1)"
wait "$spinner"
rm -rf "$neighbour_ledger"
say "fault containment: the faulting process: $poisoned; its neighbour: $(cat "$ledger/spin.out")"
[[ "$(number result "$poisoned")" == 700 ]] || fail "the poison kernel did not report an illegal address (700): $poisoned"
[[ "$(number result "$(cat "$ledger/spin.out")")" == 0 ]] || fail "the neighbour was disturbed: $(cat "$ledger/spin.out")"

alone="$(number kernels_per_s "$(bounded "$probe" spin --seconds 5 2>&1)")"
bounded "$probe" spin --seconds 5 >"$ledger/a.out" 2>&1 &
first=$!
second="$(number kernels_per_s "$(bounded "$probe" spin --seconds 5 2>&1)")"
wait "$first"
first="$(number kernels_per_s "$(cat "$ledger/a.out")")"
say "time-slicing, no compute cap: alone ${alone} kernels/s; side by side ${first} and ${second} ($(awk -v a="$alone" -v x="$first" -v y="$second" 'BEGIN {if (a > 0) printf "%.0f %% and %.0f %% of alone", 100 * x / a, 100 * y / a}'))"

# The compute cap: the resource layer (NVML backend) serves with its compute meter, which
# writes each container folder's measured shares; two containers' processes capped at 30 % and
# 70 % run the same kernels side by side. Their SM time is the kernels each completes (every
# kernel fills the card), counted after a warm-up while the gates settle, and NVML's own
# per-process reading, as the meter wrote it, averaged over the same window.
layer="$bin_dir/runtimekit-resource-layer"
# On tmpfs, as /run is on a node: the meter matches a process's mapped ledger by device and
# inode, which overlayfs (where a temporary folder may be) reports differently from stat.
meter_state="$(mktemp -d /dev/shm/runtimekit-meter.XXXXXX)"
mkdir -p "$meter_state"/{thirty,seventy}/{ledger,measured}
"$layer" serve --backend nvml --socket "$ledger/layer.sock" --isolation-state-dir "$meter_state" \
  >"$ledger/layer.log" 2>&1 &
layer_pid=$!
for _ in $(seq 1 150); do
  [[ -S "$ledger/layer.sock" ]] && break
  kill -0 "$layer_pid" 2>/dev/null || break
  sleep 0.2
done
warmup=12
measured=15
# core_spin NAME PERCENT: a spinner of container NAME capped at PERCENT.
core_spin() {
  env LD_PRELOAD="$library" RUNTIMEKIT_VISIBLE_DEVICES="$uuid" RUNTIMEKIT_GPU_MEMORY_LIMIT_MIB=4096 \
    RUNTIMEKIT_GPU_CORE_LIMIT="$2" RUNTIMEKIT_ISOLATION_DIR="$meter_state/$1/ledger" \
    RUNTIMEKIT_MEASURED_DIR="$meter_state/$1/measured" \
    timeout --kill-after=5 90 "$probe" spin --warmup "$warmup" --seconds "$measured" >"$ledger/$1.out" 2>&1
}
if [[ -S "$ledger/layer.sock" ]]; then
  cpu_ns() { cat "/proc/$layer_pid/task/"*/schedstat | awk '{sum += $1} END {printf "%d", sum}'; }
  core_spin thirty 30 &
  thirty_pid=$!
  core_spin seventy 70 &
  seventy_pid=$!
  sleep "$warmup"
  ns_before="$(cpu_ns)"
  : >"$ledger/nvml-shares"
  for _ in $(seq 1 "$measured"); do
    sleep 1
    for name in thirty seventy; do
      awk -v n="$name" -v u="$uuid" '$1 == u {print n, $2}' "$meter_state/$name/measured/shares" 2>/dev/null >>"$ledger/nvml-shares"
    done
  done
  ns_after="$(cpu_ns)"
  wait "$thirty_pid" "$seventy_pid"
  t="$(number kernels_per_s "$(cat "$ledger/thirty.out")")"
  s="$(number kernels_per_s "$(cat "$ledger/seventy.out")")"
  say "compute cap 30 % / 70 %: ${t} and ${s} kernels/s ($(cat "$ledger/thirty.out" | tr '\n' ' ')/ $(cat "$ledger/seventy.out" | tr '\n' ' '))"
  share="$(awk -v x="$t" -v y="$s" 'BEGIN {if (x + y > 0) printf "%.3f", x / (x + y)}')"
  nvml="$(awk '{sum[$1] += $2; n[$1]++} END {if (n["thirty"] && n["seventy"]) printf "%.3f %.3f", sum["thirty"] / n["thirty"], sum["seventy"] / n["seventy"]}' "$ledger/nvml-shares")"
  say "compute cap: NVML's per-process SM time as metered (shares of the card, averaged): ${nvml:-none}; by kernels completed, the 30 % container has ${share:-none} of the pair's (3:7 is 0.300)"
  say "compute meter: the resource layer used $(awk -v a="$ns_before" -v b="$ns_after" -v s="$measured" 'BEGIN {printf "%.2f", (b - a) / 1e7 / s}') % of one core while metering"
  # SM time is what the driver reports per process (nvidia-smi pmon's and DCGM's "sm"): the
  # two within 10 % of 3:7. The kernels completed are reported beside it: time-slicing costs
  # the sparser process more of its kernels' throughput than of its SM time.
  read -r nt ns <<<"$nvml"
  awk -v x="${nt:-0}" -v y="${ns:-0}" 'BEGIN {r = (y > 0) ? x / y : 0; exit !(r >= 0.9 * 3 / 7 && r <= 1.1 * 3 / 7)}' ||
    fail "compute cap: SM time ${nvml:-none} is not within 10 % of 3:7"
else
  fail "the resource layer did not serve: $(tail -5 "$ledger/layer.log")"
fi
kill "$layer_pid" 2>/dev/null
wait "$layer_pid" 2>/dev/null
layer_pid=""

echo
if [[ $failures -eq 0 ]]; then
  say "OK"
  exit 0
fi
say "$failures check(s) failed"
exit 1
