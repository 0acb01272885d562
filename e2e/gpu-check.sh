#!/usr/bin/env bash
# The NVML backend checked on a machine with NVIDIA cards, against what nvidia-smi says.
#
# Runs prebuilt binaries only (never builds or downloads: the machine may have nothing but the
# driver): `runtimekit-resource-layer` and `runtimekit-cuda-probe`, built elsewhere with
# `./just gpu-check-build` and carried over. It
#   - holds a known amount of memory on card 0 with runtimekit-cuda-probe (which opens
#     libcuda.so.1 itself) and looks for that process in both listings;
#   - prints every figure of `runtimekit-resource-layer probe --facts` beside nvidia-smi's:
#     driver, names, memory, PCI, utilisation, temperatures, power, clocks, ECC, remapped rows,
#     the `topo -m` matrix, NVLink state and error counters, MIG profiles, placements,
#     GPU and compute instances; identities and counters must agree, live readings are shown;
#   - runs the probe again as an unprivileged user: it must still list every card;
#   - serves the NVML backend (health polls every 10 s, XID event wait, hang watch) for
#     GPU_CHECK_LOAD_S seconds and prints its CPU use and the card's utilisation meanwhile:
#     detection must cost at most 1 % of one core and put no load on the card;
#   - checks that MIG mode, compute mode and the MIG instances are the same afterwards;
#   - with GPU_CHECK_MIG_ROUNDTRIP=1, as root, creates one MIG instance and destroys it.
# Every call runs under a timeout. Exits non-zero when there is no GPU or any check fails.
#
# Usage: e2e/gpu-check.sh [BIN_DIR]     (default: target/gpu-check)
#   GPU_CHECK_TIMEOUT=60         seconds for each call
#   GPU_CHECK_USER=nobody        the unprivileged user
#   GPU_CHECK_MIG_ROUNDTRIP=1    also create and destroy one MIG instance (root only)
#   GPU_CHECK_HOLD_MIB=1024      memory the helper holds on card 0
#   GPU_CHECK_LOAD_S=40          how long the serving resource layer's load is measured
set -uo pipefail

bin_dir="${1:-$(dirname "$0")/../target/gpu-check}"
layer="$bin_dir/runtimekit-resource-layer"
holder="$bin_dir/runtimekit-cuda-probe"
limit="${GPU_CHECK_TIMEOUT:-60}"
user="${GPU_CHECK_USER:-nobody}"
hold_mib="${GPU_CHECK_HOLD_MIB:-1024}"
load_s="${GPU_CHECK_LOAD_S:-40}"
failures=0

say() { echo "gpu-check: $*"; }
fail() { echo "gpu-check: FAIL: $*"; failures=$((failures + 1)); }
bounded() { timeout --kill-after=5 "$limit" "$@"; }
smi() { bounded nvidia-smi "$@"; }

for binary in "$layer" "$holder"; do
  if [[ ! -x "$binary" ]]; then
    echo "gpu-check: no binary at $binary; build both with ./just gpu-check-build (on any machine) and carry $bin_dir here" >&2
    exit 2
  fi
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! smi -L >/dev/null 2>&1; then
  echo "gpu-check: FAIL: no NVIDIA GPU answers here (nvidia-smi -L fails)" >&2
  exit 1
fi

work="$(mktemp -d)"
holder_pid=""
serve_pid=""
cleanup() {
  [[ -n "$holder_pid" ]] && kill "$holder_pid" 2>/dev/null
  [[ -n "$serve_pid" ]] && kill "$serve_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# What a read-only check must leave as it found it.
state() {
  smi --query-gpu=index,mig.mode.current,mig.mode.pending,compute_mode --format=csv,noheader 2>&1
  smi mig -lgi 2>&1
  smi mig -lci 2>&1
}
before="$(state)"

say "driver and cards (nvidia-smi):"
smi -L | sed 's/^/  /'

# A process holding known memory on card 0.
bounded "$holder" --device 0 hold --mib "$hold_mib" --seconds "$((limit * 3))" >"$work/hold.out" 2>&1 &
holder_pid=$!
for _ in $(seq 1 100); do
  grep -q '^holding' "$work/hold.out" 2>/dev/null && break
  kill -0 "$holder_pid" 2>/dev/null || break
  sleep 0.2
done
if grep -q '^holding' "$work/hold.out"; then
  say "$(cat "$work/hold.out")"
else
  fail "runtimekit-cuda-probe did not hold memory: $(cat "$work/hold.out")"
  holder_pid=""
fi

facts="$work/facts"
if ! bounded "$layer" probe --backend nvml --node-name "$(hostname)" --health-wait-ms 2000 --facts \
  >"$facts" 2>"$work/probe.log"; then
  fail "the probe failed: $(tail -5 "$work/probe.log")"
fi
fact() { awk -F'\t' -v c="$1" -v f="$2" '$1=="card" && $2==c && $3==f {print $4; exit}' "$facts"; }

# One line per figure: field, probe, nvidia-smi, verdict. `same` fields must agree exactly
# (case-insensitively); `near:<abs>:<rel>` ones within abs or rel of nvidia-smi; `live` ones are
# only shown.
compare() {
  local card="$1" field="$2" probe="$3" smi_value="$4" rule="$5" verdict
  smi_value="$(echo "$smi_value" | sed 's/^ *//; s/ *$//')"
  case "$rule" in
    same)
      if [[ "${probe,,}" == "${smi_value,,}" ]]; then verdict=same; else verdict=DIFFERS; fi ;;
    near:*)
      IFS=: read -r _ abs rel <<<"$rule"
      if awk -v a="$probe" -v b="$smi_value" -v abs="$abs" -v rel="$rel" \
        'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b; exit !(a == a + 0 && b == b + 0 && (d <= abs || d <= rel * m)) }'; then
        verdict=near
      else
        verdict=DIFFERS
      fi ;;
    *) verdict=live ;;
  esac
  printf '  card %-2s %-26s %-28s %-28s %s\n' "$card" "$field" "${probe:--}" "${smi_value:--}" "$verdict"
  [[ "$verdict" == DIFFERS ]] && fail "card $card $field: probe $probe, nvidia-smi $smi_value"
}

echo
say "figures: probe beside nvidia-smi"
printf '  %-7s %-26s %-28s %-28s %s\n' "" field probe nvidia-smi verdict
driver_probe="$(awk -F'\t' '$1=="driver" {print $2}' "$facts")"
driver_smi="$(smi --query-gpu=driver_version --format=csv,noheader | head -1)"
compare - driver_version "$driver_probe" "$driver_smi" same
query=index,uuid,name,memory.total,pci.bus_id,mig.mode.current,temperature.gpu,temperature.memory,power.draw,clocks.sm,clocks.mem,utilization.gpu,utilization.memory,memory.used,ecc.errors.corrected.volatile.total,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total
while IFS=, read -r index uuid name mem_total bus mig temp mem_temp power sm_clock mem_clock util mem_util mem_used sbe dbe dbe_agg; do
  index="${index// /}"
  mig_bit=$([[ "$mig" == *Enabled* ]] && echo 1 || echo 0)
  [[ "$mig" == *N/A* || "$mig" == *"Not Supported"* ]] && mig_bit="-"
  compare "$index" uuid "$(fact "$index" uuid)" "$uuid" same
  compare "$index" name "$(fact "$index" name)" "$name" same
  compare "$index" memory_total_mib "$(fact "$index" memory_total_mib)" "$mem_total" same
  compare "$index" pci_bus_id "$(fact "$index" pci_bus_id)" "$bus" same
  compare "$index" mig_current "$(fact "$index" mig_current || true)" "$mig_bit" same
  compare "$index" gpu_temp_c "$(fact "$index" gpu_temp_c)" "$temp" near:5:0
  compare "$index" memory_temp_c "$(fact "$index" memory_temp_c)" "$mem_temp" live
  compare "$index" power_w "$(fact "$index" power_w)" "$power" near:30:0.25
  compare "$index" sm_clock_mhz "$(fact "$index" sm_clock_mhz)" "$sm_clock" live
  compare "$index" mem_clock_mhz "$(fact "$index" mem_clock_mhz)" "$mem_clock" live
  compare "$index" gpu_util_percent "$(fact "$index" gpu_util_percent)" "$util" live
  compare "$index" mem_util_percent "$(fact "$index" mem_util_percent)" "$mem_util" live
  compare "$index" fb_used_mib "$(fact "$index" fb_used_mib)" "$mem_used" near:64:0.05
  compare "$index" ecc_sbe_volatile "$(fact "$index" ecc_sbe_volatile)" "$sbe" live
  compare "$index" ecc_dbe_volatile "$(fact "$index" ecc_dbe_volatile)" "$dbe" same
  compare "$index" ecc_dbe_aggregate "$(fact "$index" ecc_dbe_aggregate)" "$dbe_agg" same
  compare "$index" nvlink_active_links "$(fact "$index" nvlink_active_links)" \
    "$(smi nvlink -s -i "$index" 2>/dev/null | grep -c 'GB/s')" same
done < <(smi --query-gpu="$query" --format=csv,noheader,nounits)

echo
say "remapped rows (nvidia-smi --query-remapped-rows)"
while IFS=, read -r bus correctable uncorrectable pending failure; do
  index="$(awk -F'\t' -v b="${bus// /}" '$1=="card" && $3=="pci_bus_id" && tolower($4)==tolower(b) {print $2}' "$facts")"
  [[ -z "$index" ]] && continue
  compare "$index" remapped_correctable "$(fact "$index" remapped_correctable)" "$correctable" same
  compare "$index" remapped_uncorrectable "$(fact "$index" remapped_uncorrectable)" "$uncorrectable" same
  compare "$index" remap_pending "$(fact "$index" remap_pending)" "$([[ $pending == *[1Yy]* ]] && echo 1 || echo 0)" same
  compare "$index" remap_failure "$(fact "$index" remap_failure)" "$([[ $failure == *[1Yy]* ]] && echo 1 || echo 0)" same
done < <(smi --query-remapped-rows=gpu_bus_id,remapped_rows.correctable,remapped_rows.uncorrectable,remapped_rows.pending,remapped_rows.failure --format=csv,noheader 2>/dev/null)

echo
say "NVLink error counters (nvidia-smi nvlink -e), summed per card"
smi nvlink -e >"$work/nvlink-e" 2>&1
while read -r gpu replay recovery; do
  compare "$gpu" nvlink_replay_errors "$(fact "$gpu" nvlink_replay_errors)" "$replay" same
  compare "$gpu" nvlink_recovery_errors "$(fact "$gpu" nvlink_recovery_errors)" "$recovery" same
done < <(awk '/^GPU [0-9]+:/ {gpu=$2; sub(":", "", gpu)} /[Rr]eplay/ {n=$NF; if (n ~ /^[0-9]+$/) replay[gpu]+=n}
     /[Rr]ecovery/ {n=$NF; if (n ~ /^[0-9]+$/) recovery[gpu]+=n}
     END {for (g in replay) print g, replay[g], recovery[g]+0}' "$work/nvlink-e")

echo
say "topology: nvidia-smi topo -m"
smi topo -m | sed 's/^/  /'
say "topology: the probe's paths (PCIe level, peer links), checked against the matrix"
gpus="$(smi --query-gpu=index --format=csv,noheader | wc -l)"
while read -r a b cell; do
  [[ "$a" -ge "$b" ]] && continue
  line="$(awk -F'\t' -v a="$a" -v b="$b" '$1=="path" && $2==a && $3==b {print $4, $5}' "$facts")"
  read -r level links <<<"$line"
  case "$cell" in
    NV*) compare "$a-$b" peer_links "$links" "${cell#NV}" same ;;
    PIX|PXB|PHB|NODE|SYS) compare "$a-$b" pcie_level "$level" "$cell" same ;;
    *) compare "$a-$b" path "$line" "$cell" live ;;
  esac
done < <(smi topo -m | awk -v n="$gpus" '/^GPU[0-9]+/ {row=substr($1,4); for (i = 2; i < 2 + n; i++) if (i - 2 != row) print row, i - 2, $i}')

echo
say "MIG: profiles, placements and instances (nvidia-smi mig -lgip/-lgipp/-lgi/-lci)"
for index in $(awk -F'\t' '$1=="card" && $3=="mig_current" && $4=="1" {print $2}' "$facts"); do
  smi mig -lgip -i "$index" | sed 's/^/  /'
  smi mig -lgipp -i "$index" | sed 's/^/  /'
  while read -r name id free_total; do
    probe="$(awk -F'\t' -v c="$index" -v n="$name" '$1=="card" && $2==c && $3=="mig_profile" && $4==n {print $5 "/" $6}' "$facts")"
    compare "$index" "profile $name (id/max)" "$probe" "$id/${free_total#*/}" same
  done < <(smi mig -lgip -i "$index" | awk '/MIG [0-9]+g\./ {for (i = 1; i <= NF; i++) if ($i == "MIG") {print $(i+1), $(i+2), $(i+3); break}}')
  smi mig -lgi -i "$index" | sed 's/^/  /'
  smi mig -lci -i "$index" | sed 's/^/  /'
  while read -r gi placement; do
    probe="$(awk -F'\t' -v c="$index" -v g="$gi" '$1=="card" && $2==c && $3=="mig_instance" && $4==g {print $7}' "$facts")"
    compare "$index" "GPU instance $gi start" "$probe" "${placement%%:*}" same
  done < <(smi mig -lgi -i "$index" | awk '/MIG [0-9]+g\./ {for (i = 1; i <= NF; i++) if ($i == "MIG") {print $(i+3), $(i+4); break}}')
done

echo
say "processes: the helper's memory in both listings"
smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits | sed 's/^/  nvidia-smi: /'
grep -P '^card\t[0-9]+\tprocess\t' "$facts" | sed 's/^/  probe: /'
# The helper runs under timeout(1): the process holding memory is the one it names, not $!.
gpu_pid="$(sed -n 's/^holding .* as pid \([0-9]*\).*/\1/p' "$work/hold.out")"
if [[ -n "$holder_pid" && -n "$gpu_pid" ]]; then
  held="$(awk -F'\t' -v p="$gpu_pid" '$1=="card" && $2=="0" && $3=="process" && $4==p {print $5}' "$facts")"
  if [[ -n "$held" && "$held" != "-" && "$held" -ge "$hold_mib" ]]; then
    say "the helper (pid $gpu_pid) holds $held MiB on card 0 in the probe's list"
  else
    fail "the helper (pid ${gpu_pid:-?}, $hold_mib MiB) is not in the probe's list of card 0 (got '${held:-nothing}')"
  fi
elif [[ -n "$holder_pid" ]]; then
  fail "the helper did not say which pid holds its memory: $(cat "$work/hold.out")"
fi

echo
say "the probe as $user (unprivileged)"
if id "$user" >/dev/null 2>&1; then
  if bounded setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups \
    "$layer" probe --backend nvml --health-wait-ms 0 --facts >"$work/facts-user" 2>"$work/user.log"; then
    grep -P '\terror\t' "$work/facts-user" | sed 's/^/  /'
    while read -r uuid; do
      grep -qF "$uuid" "$work/facts-user" || fail "as $user the probe does not list $uuid"
    done < <(smi --query-gpu=uuid --format=csv,noheader)
    say "as $user: $(grep -cP '^card\t[0-9]+\tuuid\t' "$work/facts-user") card(s) listed"
  else
    fail "as $user the probe failed: $(tail -5 "$work/user.log")"
  fi
else
  fail "no user $user to run the unprivileged probe as (set GPU_CHECK_USER)"
fi

if [[ "${GPU_CHECK_MIG_ROUNDTRIP:-0}" == 1 ]]; then
  echo
  if [[ "$(id -u)" != 0 ]]; then
    fail "the MIG round trip needs root"
  else
    card="$(awk -F'\t' '$1=="card" && $3=="mig_current" && $4=="1" {print $2; exit}' "$facts")"
    if [[ -z "$card" ]]; then
      say "MIG round trip: no card in MIG mode; skipped"
    else
      read -r profile starts <<<"$(awk -F'\t' -v c="$card" '$1=="card" && $2==c && $3=="mig_profile" {print $4, $8; exit}' "$facts")"
      say "MIG round trip on card $card: $profile at ${starts%%,*}"
      bounded "$layer" mig-roundtrip --backend nvml --card "$card" --mig-profile "$profile" \
        --start "${starts%%,*}" 2>&1 | sed 's/^/  /'
      [[ "${PIPESTATUS[0]}" == 0 ]] || fail "the MIG round trip failed"
    fi
  fi
fi

[[ -n "$holder_pid" ]] && kill "$holder_pid" 2>/dev/null
holder_pid=""

echo
say "load: the resource layer serving the NVML backend for ${load_s} s"
# Run directly (not under timeout(1)), so $! is the process whose CPU is read.
"$layer" serve --backend nvml --socket "$work/layer.sock" --state-file "$work/layer-state" \
  >"$work/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 100); do
  [[ -S "$work/layer.sock" ]] && break
  kill -0 "$serve_pid" 2>/dev/null || break
  sleep 0.2
done
if [[ -S "$work/layer.sock" ]]; then
  # Nanoseconds on a CPU, summed over its threads (stat's ticks are 10 ms: too coarse here).
  cpu_ns() { cat "/proc/$serve_pid/task/"*/schedstat | awk '{sum += $1} END {printf "%d", sum}'; }
  sleep 2
  ns_before="$(cpu_ns)"
  started="$(date +%s.%N)"
  utilisation=()
  for _ in $(seq 1 "$load_s"); do
    utilisation+=("$(smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0)")
    sleep 1
  done
  ns_after="$(cpu_ns)"
  percent="$(awk -v a="$ns_before" -v b="$ns_after" -v s="$started" -v e="$(date +%s.%N)" \
    'BEGIN {printf "%.4f", (b - a) / 1e9 / (e - s) * 100}')"
  rss="$(awk '/^VmRSS/ {printf "%.1f", $2 / 1024}' "/proc/$serve_pid/status")"
  busiest="$(printf '%s\n' "${utilisation[@]}" | sort -n | tail -1)"
  say "resource layer: ${percent} % of one core, ${rss} MiB resident, $(ls "/proc/$serve_pid/task" | wc -l) threads"
  say "card 0 utilisation while it served: at most ${busiest} % (${#utilisation[@]} samples)"
  awk -v p="$percent" 'BEGIN {exit !(p <= 1)}' || fail "detection costs ${percent} % of a core (at most 1 %)"
  grep -iE 'warn|error' "$work/serve.log" | head -5 | sed 's/^/  log: /'
else
  fail "the resource layer did not start serving: $(tail -5 "$work/serve.log")"
fi
kill "$serve_pid" 2>/dev/null
wait "$serve_pid" 2>/dev/null
serve_pid=""

sleep 1
after="$(state)"
echo
if [[ "$before" == "$after" ]]; then
  say "MIG mode, compute mode and MIG instances unchanged"
else
  fail "the check changed MIG mode, compute mode or MIG instances:"
  diff <(echo "$before") <(echo "$after") | sed 's/^/  /'
fi

echo
if [[ $failures -eq 0 ]]; then
  say "OK"
  exit 0
fi
say "$failures check(s) failed"
exit 1
