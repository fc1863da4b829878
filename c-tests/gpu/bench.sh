#!/usr/bin/env bash
# c-tests/gpu/bench.sh [LIBVGPU]: what libvgpu.so costs a CUDA program, as ratios.
#
# Builds c-tests/gpu/bench.c against libcuda.so.1 and runs each measurement alternately without
# and with LD_PRELOAD=LIBVGPU (default target/release/libvgpu.so), BENCH_RUNS times each (default
# 5): plain, ours, plain, ours, ..., so that drift (clocks, other tenants) falls on both sides.
# Every "ours" run gets a fresh region file (CUDA_DEVICE_MEMORY_SHARED_CACHE) and
# CUDA_DEVICE_MEMORY_LIMIT=$BENCH_LIMIT (default 40g), no SM limit. The medians over the runs go
# into a table: metric, plain, ours, ratio (ours / plain, lower is better), target, ok?.
#
# Driver: the real libcuda.so.1 (found as c-tests/gpu/run.sh finds it) when nvidia-smi works,
# else the stand-in of c-tests/fake-driver, built here (BENCH_FAKE=1 forces it). Stand-in numbers
# measure our hooks against a driver whose calls cost next to nothing; they are not GPU numbers.
#
# Knobs: BENCH_RUNS, BENCH_ALLOC_ITERS (5000), BENCH_GETINFO_ITERS (100000),
# BENCH_LAUNCH_ITERS (100000), BENCH_LIMIT, BENCH_RESULTS (also write the table to this file),
# BENCH_ONLY (a comma list of alloc, group, startup, getinfo, launch: only those metrics),
# BENCH_TRACE (a folder: one more start-up batch each way, every worker's line and, for ours,
# the library's debug log with its start-up phase timings, kept there).
# Runs in about two minutes on an H200. Changes no GPU setting. Benchmarks, not tests: the exit
# status is 0 whenever every run completed, whatever the ratios.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
vgpu=${1:-$root/target/release/libvgpu.so}
case $vgpu in /*) ;; *) vgpu=$PWD/$vgpu ;; esac
runs=${BENCH_RUNS:-5}
alloc_iters=${BENCH_ALLOC_ITERS:-5000}
getinfo_iters=${BENCH_GETINFO_ITERS:-100000}
launch_iters=${BENCH_LAUNCH_ITERS:-100000}
limit=${BENCH_LIMIT:-40g}
only=${BENCH_ONLY:-alloc,group,startup,getinfo,launch}
trace=${BENCH_TRACE:-}
want() { case ",$only," in *",$1,"*) return 0 ;; esac; return 1; }
work=$(mktemp -d /tmp/hami-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

if [ ! -f "$vgpu" ]; then
    echo "no $vgpu; build it with cargo build --release -p hami-vgpu"
    exit 1
fi

# ---- the driver ---------------------------------------------------------------------------
declare -a drv_env=()
mkdir -p "$work/lib"
if [ "${BENCH_FAKE:-0}" != 1 ] && nvidia-smi -L >/dev/null 2>&1; then
    libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
    [ -n "$libcuda" ] || libcuda=$(ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null | head -1)
    ln -sf "$libcuda" "$work/lib/libcuda.so.1"
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
    machine="$gpu, driver $driver"
else
    if ! make -s -C "$root/c-tests/fake-driver" OUT="$work/lib" >"$work/fake.log" 2>&1; then
        cat "$work/fake.log"
        exit 1
    fi
    # Kernels take no simulated GPU time, so the launch row times the calls themselves.
    drv_env=(LD_LIBRARY_PATH="$work/lib" FAKE_GPU_STATE="$work/fake.state" FAKE_GPU_MEM_MB=81920
        FAKE_NS_PER_BLOCK=0)
    machine="STAND-IN DRIVER (c-tests/fake-driver), not a GPU"
fi
echo "=== bench: $machine; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "=== $(date -u +%Y-%m-%dT%H:%MZ); libvgpu $vgpu; $runs alternating runs per metric"

bench=$work/bench
if ! gcc -std=gnu11 -O2 -Wall -Wextra -Werror -I"$root/c-tests/fake-driver" -o "$bench" \
    "$here/bench.c" -L"$work/lib" -Wl,--no-as-needed -l:libcuda.so.1 -Wl,-rpath,"$work/lib" \
    >"$work/build.log" 2>&1; then
    cat "$work/build.log"
    exit 1
fi

# ---- runs ---------------------------------------------------------------------------------
# run SIDE ARGS...: one run of the bench (SIDE plain or ours); its log's path in $log. (Not
# called in $(...): the run counter and the failure count live in this shell.)
nrun=0
failed=0
declare -a ours_env=() side_env=()  # extra variables for ours / for both sides (the trace)
run() {
    local side=$1; shift
    nrun=$((nrun + 1))
    log=$work/run$nrun.log
    local -a pre=()
    if [ "$side" = ours ]; then
        rm -f "$work/region"
        pre=(LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region"
            CUDA_DEVICE_MEMORY_LIMIT="$limit" "${ours_env[@]}")
    fi
    env "${drv_env[@]}" "${pre[@]}" "${side_env[@]}" timeout -k 5 120 "$bench" "$@" >"$log" 2>"$log.err"
    local rc=$?
    if [ "$rc" -ne 0 ] || grep -q '^FAIL' "$log"; then
        echo "run $nrun ($side: bench $*) failed, rc $rc:" >&2
        cat "$log" >&2
        tail -5 "$log.err" >&2
        failed=$((failed + 1))
    fi
}

# pairs ARGS...: BENCH_RUNS alternating runs, plain then ours; logs in plain_logs, ours_logs.
declare -a plain_logs=() ours_logs=()
pairs() {
    plain_logs=()
    ours_logs=()
    local i
    for i in $(seq 1 "$runs"); do
        run plain "$@"
        plain_logs+=("$log")
        run ours "$@"
        ours_logs+=("$log")
    done
}

values() { # KEY LOG...: the value of KEY= in each log ("nan" where missing)
    local key=$1 f v; shift
    for f in "$@"; do
        v=$(sed -n "s/.*$key=\([0-9.]*\).*/\1/p" "$f" | head -1)
        echo "${v:-nan}"
    done
}

median() { # values on stdin -> the median (nan if none)
    sort -g | awk '$1 != "nan" {v[n++] = $1} END {if (n == 0) print "nan"; else if (n % 2) print v[(n-1)/2]; else printf "%.1f\n", (v[n/2-1] + v[n/2]) / 2}'
}

declare -a rows=()
# row NAME UNIT SCALE TARGET KEY: a table row from the last pairs' logs. SCALE divides the
# nanoseconds for display (1 = ns, 1000000 = ms).
row() {
    local name=$1 unit=$2 scale=$3 target=$4 key=$5
    local p o r
    p=$(values "$key" "${plain_logs[@]}" | median)
    o=$(values "$key" "${ours_logs[@]}" | median)
    r=$(awk -v n="$name" -v u="$unit" -v s="$scale" -v t="$target" -v p="$p" -v o="$o" 'BEGIN {
        if (p == "nan" || o == "nan" || p + 0 == 0) { r = "nan"; ok = "FAILED" }
        else { r = sprintf("%.3f", o / p); ok = (o / p <= t + 0) ? "ok" : "NO" }
        printf "| %-56s | %12.3f | %12.3f | %6s | <= %-4s | %-6s |", n " (" u ")", p / s, o / s, r, t, ok
    }')
    rows+=("$r")
    echo "$r"
    echo "    plain: $(values "$key" "${plain_logs[@]}" | tr '\n' ' ')"
    echo "    ours:  $(values "$key" "${ours_logs[@]}" | tr '\n' ' ')"
}

if want alloc; then
    echo "=== alloc, 1 process"
    pairs alloc "$alloc_iters"
    row "cuMemAlloc+cuMemFree 2 MiB, 1 process" "us/pair" 1000 1.05 alloc_ns
fi
if want group; then
    echo "=== alloc, 8 processes at once"
    pairs group 8 alloc "$alloc_iters"
    row "cuMemAlloc+cuMemFree 2 MiB, 8 processes" "median us/pair" 1000 1.05 group_median
fi
if want startup; then
    echo "=== start-up, 16 processes at once"
    pairs group 16 startup
    row "start-up of 16 processes at once: whole batch" "ms" 1000000 1.1 group_wall_ns
    row "start-up of 16 processes at once: each" "median ms" 1000000 1.1 group_median
    if [ -n "$trace" ]; then
        mkdir -p "$trace"
        side_env=(BENCH_VERBOSE=1)
        ours_env=(LIBCUDA_LOG_LEVEL=4)
        run plain group 16 startup
        cat "$log" "$log.err" >"$trace/startup-plain.txt"
        run ours group 16 startup
        cat "$log" "$log.err" >"$trace/startup-ours.txt"
        side_env=()
        ours_env=()
    fi
fi
if want getinfo; then
    echo "=== cuMemGetInfo"
    pairs getinfo "$getinfo_iters"
    row "cuMemGetInfo" "us/call" 1000 1.05 getinfo_ns
fi
if want launch; then
    echo "=== kernel launch"
    pairs launch "$launch_iters"
    row "kernel launch, empty kernel, no SM limit" "us/launch" 1000 1.05 launch_ns
fi
echo
echo "=== libvgpu.so overhead on $machine, $(date -u +%Y-%m-%dT%H:%MZ), medians of $runs runs"
{
    printf '| %-56s | %12s | %12s | %6s | %-7s | %-6s |\n' metric plain ours ratio target ok?
    printf '|%s|%s|%s|%s|%s|%s|\n' "----------------------------------------------------------" \
        "--------------" "--------------" "--------" "---------" "--------"
    printf '%s\n' "${rows[@]}"
    [ "$failed" -eq 0 ] || echo "$failed runs failed (see above)"
} | tee "${BENCH_RESULTS:-/dev/null}"
[ "$failed" -eq 0 ]
