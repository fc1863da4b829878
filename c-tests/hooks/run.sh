#!/usr/bin/env bash
# run.sh BUILD FAKE LIBVGPU: runs every hook test over the stand-in driver, each under
# LD_PRELOAD=LIBVGPU with its own FAKE_GPU_STATE and CUDA_DEVICE_MEMORY_SHARED_CACHE, and prints a
# summary. Exit status 1 if any test failed. HK_ONLY='herd|limit' runs only the rows so named.
set -u
build=$(cd "$1" && pwd)
fake=$(cd "$2" && pwd)
vgpu=$(cd "$(dirname "$3")" && pwd)/$(basename "$3")
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$vgpu" ] || { echo "no $vgpu: build it first (cargo build --release -p hami-vgpu -p hami-tool: libvgpu.so and shrreg-tool)"; exit 1; }
[ -f "$fake/libcuda.so.1" ] || { echo "no stand-in driver in $fake"; exit 1; }

tmp=$(mktemp -d /tmp/hk-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
declare -a rows=()
failed=0

# t NAME TIMEOUT ENV... -- COMMAND...
t() {
    local name=$1 limit=$2; shift 2
    [[ -z "${HK_ONLY:-}" || $name =~ ^(${HK_ONLY})$ ]] || return 0
    local -a envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local state="$tmp/$name.state" cache="$tmp/$name.region" log="$tmp/$name.log"
    local start=$SECONDS
    echo "=== $name"
    env FAKE_GPU_STATE="$state" CUDA_DEVICE_MEMORY_SHARED_CACHE="$cache" \
        LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" LD_PRELOAD="$vgpu" \
        "${envs[@]}" timeout -k 5 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    cat "$log"
    local np nf
    np=$(grep -c '^PASS' "$log")
    nf=$(grep -c '^FAIL' "$log")
    local verdict=ok
    if [ "$rc" -ne 0 ] || [ "$nf" -ne 0 ] || [ "$np" -eq 0 ]; then
        verdict=FAILED
        failed=$((failed + 1))
        [ "$rc" -eq 124 ] && verdict="FAILED (timeout)"
    fi
    rows+=("$(printf '%-16s %-18s %4s pass %3s fail  rc %-3s %3ss' "$name" "$verdict" "$np" "$nf" "$rc" $((SECONDS - start)))")
}

# t_unshared NAME TIMEOUT "UNSHARE_OPTIONS" ENV... -- COMMAND...: `t` with COMMAND run under
# `unshare UNSHARE_OPTIONS`, or a SKIPPED row where this machine does not allow that namespace.
t_unshared() {
    local name=$1 limit=$2 opts=$3; shift 3
    # shellcheck disable=SC2086 # the options are separate words
    if ! unshare $opts true 2>/dev/null; then
        rows+=("$(printf '%-16s SKIPPED (unshare %s is not allowed here)' "$name" "$opts")")
        return
    fi
    local -a envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    # shellcheck disable=SC2086
    t "$name" "$limit" "${envs[@]}" -- unshare $opts "$@"
}

t limit 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g -- "$build/t_limit"
t limit-pidns 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_NVML_PID_OFFSET=100000 -- "$build/t_limit"
t limit-2m-ctx 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=2m -- "$build/t_limit"
t paths 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m -- "$build/t_paths"
t paths-64k 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m FAKE_GPU_GRANULE=64k -- "$build/t_paths"
# The library's own pool trim (at the limit) is slow here; another thread's pool free and
# allocation must not wait for it, and the accounting stays exact.
t pooltrim 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m FAKE_POOL_TRIM_MS=1500 -- "$build/t_pooltrim"
t resolve 60 CUDA_DEVICE_MEMORY_LIMIT=1g -- "$build/t_resolve"
t multi 180 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g HK_PROCS=8 FAKE_CTX_BYTES=32m HAMI_CONTEXT_SIZE=32m -- "$build/t_multi"
# The region file cut to 0 under a process holding memory (issue 16): it survives, logs one
# line, and still refuses past its limit.
t truncate 120 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m -- "$build/t_truncate"
t sigkill 120 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m HAMI_CONTEXT_SIZE=64m -- "$build/t_sigkill"
# Off the happy path: a stopped lock holder, a full slot table, sizes near 2^64, dead
# processes' usage, a stricter limit, no usable region; real usage sampled throughout.
t failclosed 180 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m HAMI_CONTEXT_SIZE=64m -- "$build/t_failclosed"
# 32 processes hammer 2 GiB while a lock holder is stopped and 8 of them are SIGKILLed.
t hammer 120 CUDA_DEVICE_MEMORY_LIMIT=2g HK_LIMIT=2g HK_PROCS=32 HK_SECONDS=6 FAKE_CTX_BYTES=64m HAMI_CONTEXT_SIZE=64m -- "$build/t_hammer"
# Contexts: 32 processes retain a 500 MiB context at once (created in 300 ms, destroyed in
# 200 ms) under 8 GiB: 16 admitted, real usage sampled within the limit; 16 under 6 GiB: 12.
t herd 120 CUDA_DEVICE_MEMORY_LIMIT=8g HK_LIMIT=8g HK_PROCS=32 FAKE_CTX_BYTES=500m FAKE_CTX_CREATE_MS=300 FAKE_CTX_DESTROY_MS=200 -- "$build/t_herd"
t herd-6g 120 CUDA_DEVICE_MEMORY_LIMIT=6g HK_LIMIT=6g HK_PROCS=16 FAKE_CTX_BYTES=500m FAKE_CTX_CREATE_MS=300 FAKE_CTX_DESTROY_MS=200 -- "$build/t_herd"
t devices 120 FAKE_CUDA_DEVICES=2 CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g FAKE_CTX_BYTES=64m -- "$build/t_devices"
t config 120 -- bash "$here/config.sh" "$build"
t smlimit 60 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m -- "$build/t_smlimit"
# A CUDA graph costs the SM limiter its kernels' blocks, counted at instantiation (nested
# child graphs, conditional bodies, every instantiate and update entry point).
t graph 60 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m GPU_CORE_UTILIZATION_POLICY=force \
    CUDA_DEVICE_SM_LIMIT=50 -- "$build/t_graph"
# The same where cuGraphNodeGetParams reports conditional bodies (CUDA 13.2 drivers).
t graph-13.2 60 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m GPU_CORE_UTILIZATION_POLICY=force \
    CUDA_DEVICE_SM_LIMIT=50 FAKE_CUDA_VERSION=13020 -- "$build/t_graph"
# The same on a clock past 2^31 ms (25.5 days of uptime), in a time namespace of its own: the
# controller lease's expiry wraps at 32 bits, and a wrong comparison there left every device
# without a controller, unthrottled, on hosts up 24.8 to 49.7 days.
t_unshared smlimit-uptime 60 "--time --fork --monotonic 2200000" \
    CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m -- "$build/t_smlimit"
# Without NVML (it cannot be initialised): the limit holds on the launch rate alone.
t smlimit-no-nvml 60 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m FAKE_NVML_FAIL=init -- "$build/t_smlimit"
# A limit above the GPU's memory: HAMi-core's views with CUDA_OVERSUBSCRIBE=true, capped without.
t oversub 60 FAKE_GPU_MEM_MB=1024 CUDA_DEVICE_MEMORY_LIMIT=2g HK_LIMIT=2g HK_OVERSUB=1 \
    CUDA_OVERSUBSCRIBE=true FAKE_CTX_BYTES=64m -- "$build/t_oversub"
t oversub-off 60 FAKE_GPU_MEM_MB=1024 CUDA_DEVICE_MEMORY_LIMIT=2g HK_LIMIT=2g HK_OVERSUB=0 \
    FAKE_CTX_BYTES=64m -- "$build/t_oversub"
t hostpid 120 CUDA_DEVICE_MEMORY_LIMIT=8g FAKE_CTX_BYTES=64m HAMI_CONTEXT_SIZE=64m -- "$build/t_hostpid"
# The same in a pid namespace of its own, where check (c) takes its other branch.
t_unshared hostpid-pidns 120 "--pid --fork --mount-proc" \
    CUDA_DEVICE_MEMORY_LIMIT=8g FAKE_CTX_BYTES=64m HAMI_CONTEXT_SIZE=64m -- "$build/t_hostpid"
# NVML's process queries inside the container: its processes under its pids, nobody else's.
t procs 60 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m FAKE_NVML_PID_OFFSET=10000000 -- "$build/t_procs"
# The driver never spends more on an odd-sized allocation than the region counts.
t alloc-cost 60 CUDA_DEVICE_MEMORY_LIMIT=8g FAKE_CTX_BYTES=64m -- "$build/t_alloc_cost"
if command -v python3 >/dev/null; then
    # Under HAMi's monitor (a port of its Go feedback loop and metric reads): SM limit and
    # priority between containers, the metrics, the bytes it reads, suspend/resume.
    t monitor 90 CUDA_DEVICE_MEMORY_LIMIT=4g FAKE_CTX_BYTES=64m HK_BUILD="$build" \
        HK_TOOL="$(dirname "$vgpu")/shrreg-tool" -- python3 "$here/t_monitor.py"
    t ctypes 60 CUDA_DEVICE_MEMORY_LIMIT=1g HK_LIMIT=1g FAKE_CTX_BYTES=64m -- python3 "$here/t_ctypes.py"
    # shrreg-tool over a region of live processes: --metrics parsed by prometheus_client against
    # the monitor port's reads; top under a pseudo-terminal (q, Ctrl-C, --iterations, a file cut
    # under it).
    t tool-metrics 120 CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CTX_BYTES=64m \
        HK_TOOL="$(dirname "$vgpu")/shrreg-tool" -- python3 "$here/t_tool_metrics.py"
    t tool-top 120 CUDA_DEVICE_MEMORY_LIMIT=1g FAKE_CTX_BYTES=64m \
        HK_TOOL="$(dirname "$vgpu")/shrreg-tool" -- python3 "$here/t_tool_top.py"
else
    rows+=("ctypes           SKIPPED (no python3)")
    rows+=("monitor          SKIPPED (no python3)")
    rows+=("tool-metrics     SKIPPED (no python3)")
    rows+=("tool-top         SKIPPED (no python3)")
fi

echo "=== hook tests over the stand-in driver"
printf '%s\n' "${rows[@]}"
[ "$failed" -eq 0 ] && echo "all passed" || echo "$failed test(s) failed"
[ "$failed" -eq 0 ]
