#!/usr/bin/env bash
# c-tests/gpu/sm_limit.sh [LIBVGPU]: does CUDA_DEVICE_SM_LIMIT hold on a real GPU?
#
# Runs sm_work.py (bf16 matrix multiplications, compute-bound) under LD_PRELOAD=libvgpu.so with
# GPU_CORE_UTILIZATION_POLICY=force and CUDA_DEVICE_SM_LIMIT = 100 (no limit), 25, 50 and 75,
# as one process and as 4 processes sharing one region (one limit for all four), and prints each
# throughput as a percentage of the unlimited run with the same number of processes, against
# the target band (limit +- 3 points). Also runs once without LD_PRELOAD (the plain driver) for
# the library's own cost. Changes no GPU setting. About 2 minutes. HK_RESULTS=FILE appends the
# table to FILE; SM_WARMUP / SM_MEASURE set the seconds (default 8 and 8); SM_TRACE=DIR keeps
# the controller's steps of each run in DIR.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
vgpu=${1:-$root/target/release/libvgpu.so}
case $vgpu in /*) ;; *) vgpu=$PWD/$vgpu ;; esac
work=$(mktemp -d /tmp/hami-sm.XXXXXX)
trap 'rm -rf "$work"' EXIT
warmup=${SM_WARMUP:-8}
measure=${SM_MEASURE:-8}
trace=${SM_TRACE:-}  # a folder: each limited run's controller steps (LIBCUDA_LOG_LEVEL=4) go there
py="$here/sm_work.py"
[ -f "$vgpu" ] || { echo "no $vgpu"; exit 1; }

# measure NAME PROCS PRELOAD LIMIT: runs PROCS processes together; prints their summed TFLOP/s.
measure() {
    local name=$1 procs=$2 preload=$3 limit=$4
    local region=$work/$name.region t0 i
    rm -f "$region"
    t0=$(($(date +%s) + ${SM_START:-10}))  # torch start-up of all processes fits in 10 s
    for i in $(seq 1 "$procs"); do
        if [ "$preload" = 1 ]; then
            env LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$region" \
                GPU_CORE_UTILIZATION_POLICY=force CUDA_DEVICE_SM_LIMIT="$limit" \
                ${trace:+LIBCUDA_LOG_LEVEL=4} \
                timeout -k 5 90 python3 "$py" "$t0" "$warmup" "$measure" >"$work/$name.$i.log" 2>&1 &
        else
            timeout -k 5 90 python3 "$py" "$t0" "$warmup" "$measure" >"$work/$name.$i.log" 2>&1 &
        fi
    done
    wait
    local sum=0 v
    for i in $(seq 1 "$procs"); do
        v=$(sed -n 's/^tflops=\([0-9.]*\).*/\1/p' "$work/$name.$i.log")
        if [ -z "$v" ]; then
            echo "--- $name.$i produced no result:" >&2
            tail -5 "$work/$name.$i.log" >&2
            echo "-1"
            return
        fi
        sum=$(awk -v a="$sum" -v b="$v" 'BEGIN { print a + b }')
    done
    grep -h 'HAMI-core' "$work/$name".*.log | grep -v 'sm-limit\|Debug\|Info' | sort | uniq -c | head -5 >&2
    [ -n "$trace" ] && mkdir -p "$trace" && grep -h 'sm-limit' "$work/$name".*.log >"$trace/$name.txt"
    echo "$sum"
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
declare -a rows=()
fails=0
plain=$(measure plain 1 0 100)
for procs in 1 4; do
    base=$(measure "p${procs}_none" "$procs" 1 100)
    rows+=("$(printf '%-7s %-6s %9.1f %7s %-12s %s' "$procs" none "$base" 100% "-" "reference")")
    for limit in 25 50 75; do
        got=$(measure "p${procs}_$limit" "$procs" 1 "$limit")
        pct=$(awk -v g="$got" -v b="$base" 'BEGIN { print (b > 0 && g >= 0) ? 100 * g / b : -1 }')
        ok=$(awk -v p="$pct" -v l="$limit" 'BEGIN { print (p >= l - 3 && p <= l + 3) ? 1 : 0 }')
        verdict=PASS
        [ "$ok" = 1 ] || { verdict=FAIL; fails=$((fails + 1)); }
        rows+=("$(printf '%-7s %-6s %9.1f %6.1f%% %-12s %s' "$procs" "$limit%" "$got" "$pct" "$((limit - 3))..$((limit + 3))%" "$verdict")")
    done
done
{
    echo "SM limit, bf16 8192^3 matmul, $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%Y-%m-%dT%H:%MZ)"
    printf 'plain driver, 1 process: %.1f TFLOP/s; libvgpu without a limit: see "none" rows\n' "$plain"
    printf '%-7s %-6s %9s %7s %-12s %s\n' procs limit TFLOP/s "of none" target verdict
    printf '%s\n' "${rows[@]}"
    echo "$fails outside the target band"
} | tee -a "${HK_RESULTS:-/dev/null}"
[ "$fails" -eq 0 ]
