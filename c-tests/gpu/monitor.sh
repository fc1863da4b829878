#!/usr/bin/env bash
# c-tests/gpu/monitor.sh [LIBVGPU]: two containers under HAMi's monitor on a real GPU.
#
# Two "containers" (two region files, c-tests/gpu/sm_work.py in each: bf16 matmuls) share GPU 0
# with CUDA_DEVICE_SM_LIMIT=25 each under the default policy (no GPU_CORE_UTILIZATION_POLICY),
# while c-tests/monitor/hami_monitor.py (a port of HAMi's vGPUmonitor feedback loop, HAMi
# 4707fb02) ticks every 5 s over their directory, as HAMi deploys it. Prints each container's
# throughput as a share of one container alone without a limit; target 22..28% each. Then the
# same pair with GPU_CORE_UTILIZATION_POLICY=force (no monitor needed) for comparison, and the
# pair without a limit (each about 50%: the GPU is shared, nothing throttles).
# MON_WARMUP / MON_MEASURE: seconds (default 40 and 15; the limiter re-measures a program held
# back every 20 s, so its share settles after the first re-measurement). HK_RESULTS=FILE appends
# the table; MON_TRACE=DIR keeps each process's log there with the controller's steps
# (LIBCUDA_LOG_LEVEL=4: its own and the device's utilisation, the rate). About 4 minutes. Needs
# python3 with torch; changes no GPU setting.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
vgpu=${1:-$root/target/release/libvgpu.so}
case $vgpu in /*) ;; *) vgpu=$PWD/$vgpu ;; esac
[ -f "$vgpu" ] || { echo "no $vgpu"; exit 1; }
work=$(mktemp -d /tmp/hami-mon.XXXXXX)
mon_pid=
trap '[ -n "$mon_pid" ] && kill "$mon_pid" 2>/dev/null; rm -rf "$work"' EXIT
warmup=${MON_WARMUP:-40}
measure=${MON_MEASURE:-15}
py="$here/sm_work.py"
trace=${MON_TRACE:-}

# run NAME PROCS LIMIT POLICY MONITOR: PROCS containers together; prints one TFLOP/s per line.
run() {
    local name=$1 procs=$2 limit=$3 policy=$4 monitor=$5 t0 i dir
    local node=$work/$name
    mkdir -p "$node"
    if [ "$monitor" = 1 ]; then
        python3 "$root/c-tests/monitor/hami_monitor.py" "$node" --interval 5 --metrics \
            >"$work/$name.monitor.log" 2>&1 &
        mon_pid=$!
    fi
    t0=$(($(date +%s) + 10))
    for i in $(seq 1 "$procs"); do
        dir=$node/pod$i-uid_main
        mkdir -p "$dir"
        env LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$dir/region.cache" \
            CUDA_DEVICE_SM_LIMIT="$limit" ${policy:+GPU_CORE_UTILIZATION_POLICY=$policy} \
            ${trace:+LIBCUDA_LOG_LEVEL=4} \
            timeout -k 5 $((warmup + measure + 60)) python3 "$py" "$t0" "$warmup" "$measure" \
            >"$work/$name.$i.log" 2>&1 &
    done
    wait $(jobs -p | grep -v "^${mon_pid:-x}\$")
    if [ -n "$mon_pid" ]; then
        kill "$mon_pid" 2>/dev/null
        wait "$mon_pid" 2>/dev/null
        mon_pid=
        echo "--- $name: the monitor's last view of each container:" >&2
        tail -n 2 "$work/$name.monitor.log" | cut -c1-220 >&2
    fi
    [ -n "$trace" ] && mkdir -p "$trace" && cp "$work/$name".*.log "$trace/"
    for i in $(seq 1 "$procs"); do
        v=$(sed -n 's/^tflops=\([0-9.]*\).*/\1/p' "$work/$name.$i.log")
        if [ -z "$v" ]; then
            echo "--- $name.$i produced no result:" >&2
            tail -5 "$work/$name.$i.log" >&2
            v=-1
        fi
        echo "$v"
    done
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
solo=$(run solo 1 100 "" 0)
declare -a rows=()
fails=0
for spec in "monitor:25::1" "force:25:force:0" "nolimit:100::0"; do
    IFS=: read -r name limit policy monitor <<<"$spec"
    i=0
    for v in $(run "$name" 2 "$limit" "$policy" "$monitor"); do
        i=$((i + 1))
        pct=$(awk -v g="$v" -v b="$solo" 'BEGIN { print (b > 0 && g >= 0) ? 100 * g / b : -1 }')
        verdict=-
        if [ "$name" != nolimit ]; then
            verdict=$(awk -v p="$pct" 'BEGIN { print (p >= 22 && p <= 28) ? "PASS" : "FAIL" }')
            [ "$verdict" = PASS ] || fails=$((fails + 1))
        fi
        rows+=("$(printf '%-9s %-9s %-9s %9.1f %6.1f%% %s' "$name" "container$i" "${policy:-default}" "$v" "$pct" "$verdict")")
    done
done
{
    echo "Two containers on one GPU, SM limit 25 each, bf16 8192^3 matmul, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%dT%H:%MZ)"
    printf 'one container alone, no limit: %.1f TFLOP/s (the reference); warm-up %s s, measured %s s\n' "$solo" "$warmup" "$measure"
    printf '%-9s %-9s %-9s %9s %7s %s\n' run container policy TFLOP/s "of solo" "verdict (22..28%)"
    printf '%s\n' "${rows[@]}"
    echo "$fails outside the target band"
} | tee -a "${HK_RESULTS:-/dev/null}"
[ "$fails" -eq 0 ]
