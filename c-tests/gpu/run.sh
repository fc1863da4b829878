#!/usr/bin/env bash
# c-tests/gpu/run.sh [LIBVGPU]: libvgpu.so on a real NVIDIA GPU.
#
# For the device machine (gcc, nvcc, PyTorch, the NVIDIA driver; no Rust): build libvgpu.so
# elsewhere (cargo build --release -p hami-vgpu) and pass its path (default
# target/release/libvgpu.so). The script compiles the hook tests of c-tests/hooks against the
# real libcuda.so.1 / libnvidia-ml.so.1, and a CUDA runtime program with nvcc, then runs them
# and PyTorch under LD_PRELOAD, each with its own region file, every step under a timeout, and
# prints a pass/fail table with the numbers. It changes no GPU setting. Total runtime is a few
# minutes. Set HK_RESULTS to also write the table to a file; HK_SKIP_TORCH=1 skips PyTorch;
# GPU_ONLY='herd-32|hammer-32' runs only the steps so named (the others leave no row).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
vgpu=${1:-$root/target/release/libvgpu.so}
case $vgpu in /*) ;; *) vgpu=$PWD/$vgpu ;; esac
work=$(mktemp -d /tmp/hami-gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
declare -a rows=()
nfail=0
npass=0

wanted() { [ -z "${GPU_ONLY:-}" ] || [[ $1 =~ ^(${GPU_ONLY})$ ]]; }

row() { # row NAME VERDICT DETAIL (a step left out by GPU_ONLY leaves no row)
    [ "$2" = SKIP ] && return 0
    rows+=("$(printf '%-22s %-5s %s' "$1" "$2" "$3")")
    if [ "$2" = PASS ]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); fi
}

echo "=== libvgpu: $vgpu"
if [ ! -f "$vgpu" ]; then
    echo "no $vgpu; build it with cargo build --release -p hami-vgpu and carry it"
    exit 1
fi
nvidia-smi -L 2>&1 | head -8
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "driver $driver, $ngpu x $gpu, $(date -u +%Y-%m-%dT%H:%MZ)"

libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
libnvml=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$libcuda" ] || libcuda=$(ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null | head -1)
[ -n "$libnvml" ] || libnvml=$(ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/local/nvidia/lib64/libnvidia-ml.so.1 2>/dev/null | head -1)
echo "libcuda.so.1: ${libcuda:-not found}; libnvidia-ml.so.1: ${libnvml:-not found}"
mkdir -p "$work/lib"
ln -sf "$libcuda" "$work/lib/libcuda.so.1"
ln -sf "$libnvml" "$work/lib/libnvidia-ml.so.1"

# ---- build -------------------------------------------------------------------------------
bin=$work/bin
if timeout 120 make -s -C "$root/c-tests/hooks" all BUILD="$bin" \
    CUDA_LIBS="-L$work/lib -Wl,--no-as-needed -l:libcuda.so.1 -l:libnvidia-ml.so.1" >"$work/build.log" 2>&1; then
    row build-c PASS "c-tests/hooks against the real driver"
else
    row build-c FAIL "$(tail -3 "$work/build.log" | tr '\n' ' ')"
fi
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
if [ -n "$nvcc" ] && timeout 180 "$nvcc" -O2 -o "$bin/cuda_runtime" "$here/cuda_runtime.cu" >"$work/nvcc.log" 2>&1; then
    row build-cuda PASS "nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
else
    row build-cuda FAIL "$(tail -3 "$work/nvcc.log" 2>/dev/null | tr '\n' ' ')"
fi

# ---- running one step --------------------------------------------------------------------
# step NAME TIMEOUT ENV... -- COMMAND...: runs under LD_PRELOAD with a fresh region file; the
# verdict is PASS when it exits 0 and printed no FAIL line. Leaves the log in $log.
step() {
    local name=$1 limit=$2; shift 2
    log=$work/$name.log
    : >"$log"
    if ! wanted "$name"; then
        verdict=SKIP detail=
        return 0
    fi
    local -a envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    region=$work/$name.region
    rm -f "$region"
    local start=$SECONDS
    echo "=== $name"
    env CUDA_DEVICE_MEMORY_SHARED_CACHE="$region" LD_PRELOAD="$vgpu" PYTHONUNBUFFERED=1 \
        "${envs[@]}" timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    cat "$log"
    local np nf
    np=$(grep -c '^PASS' "$log")
    nf=$(grep -c '^FAIL' "$log")
    verdict=PASS
    { [ "$rc" -ne 0 ] || [ "$nf" -ne 0 ]; } && verdict=FAIL
    detail="$np checks passed, $nf failed, rc $rc, $((SECONDS - start))s"
    [ "$rc" -eq 124 ] && detail="TIMEOUT after ${limit}s; $detail"
}
info() { grep -o "$1" "$log" | head -1; }

# ---- C tests (same sources as CI) --------------------------------------------------------
if [ -x "$bin/t_limit" ]; then
    step limit-4g 60 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT=4g -- "$bin/t_limit"
    row c-limit-4g "$verdict" "$(grep -o '[0-9]* chunks of 64 MiB admitted ([0-9]* MiB) + context [0-9]* MiB' "$log" | head -1); $detail"
    step paths 120 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT=4g -- "$bin/t_paths"
    row c-every-path "$verdict" "$detail"
    # What the driver spends on odd-sized cuMemAlloc against what the region counts (the
    # hammer's excess in run 11).
    step alloc-cost 60 CUDA_DEVICE_MEMORY_LIMIT=8g -- "$bin/t_alloc_cost"
    row c-alloc-cost "$verdict" "$(grep -o '[0-9]* held ([0-9]* MiB asked): counted [0-9]* MiB, the driver [0-9]* MiB' "$log" | head -1); $detail"
    step resolve 60 CUDA_DEVICE_MEMORY_LIMIT=4g -- "$bin/t_resolve"
    row c-dlsym-procaddr "$verdict" "$detail"
    # A CUDA graph's launch costs its kernels' blocks, counted at instantiation (nested child
    # graphs and conditional bodies; bash c-tests/gpu/graph_probe.sh shows the driver's side).
    step graph 60 CUDA_DEVICE_MEMORY_LIMIT=4g GPU_CORE_UTILIZATION_POLICY=force \
        CUDA_DEVICE_SM_LIMIT=50 -- "$bin/t_graph"
    row c-graph "$verdict" "$detail"
    step multi-8 180 CUDA_DEVICE_MEMORY_LIMIT=8g HK_LIMIT=8g HK_PROCS=8 -- "$bin/t_multi"
    row c-8-processes "$verdict" "$(grep -o 'allocations admitted, [0-9]* refused' "$log" | head -1); $(grep -o 'max [0-9]* MiB <= [0-9]* MiB' "$log" | head -1); $detail"
    step sigkill 120 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT=4g -- "$bin/t_sigkill"
    row c-sigkill "$verdict" "$(grep -o 'the next one got [0-9]* MiB + context [0-9]* MiB' "$log" | head -1); $detail"
    # 32 processes hammer 8 GiB; one holds the region lock stopped for a third of the run and 8
    # are SIGKILLed; NVML's real usage sampled every 2 ms; a fresh process sees no phantom.
    step hammer-32 180 CUDA_DEVICE_MEMORY_LIMIT=8g HK_LIMIT=8g HK_PROCS=32 HK_SECONDS=12 \
        -- "$bin/t_hammer"
    row c-hammer-32 "$verdict" "$(grep -o 'peak [0-9]* MiB of [0-9]*' "$log" | head -1); $(grep -o '[0-9]* processes got a context' "$log" | head -1); $(grep -o '[0-9]* while the lock holder was stopped' "$log" | head -1); $(grep -o 'fresh [0-9]*' "$log" | head -1); $detail"
    # 32 processes retain a primary context at once under 8 GiB: as many as fit at the cost
    # measured once and published; NVML's real usage sampled every 2 ms stays within the limit.
    step herd-32 180 CUDA_DEVICE_MEMORY_LIMIT=8g HK_LIMIT=8g HK_PROCS=32 -- "$bin/t_herd"
    row c-herd-32 "$verdict" "$(grep -o '[0-9]* got a context, [0-9]* refused' "$log" | head -1); $(grep -o 'context cost: [0-9]* MiB' "$log" | head -1); $(grep -o 'peak [0-9]* MiB of [0-9]*' "$log" | head -1); $(grep -o 'slowest answer took [0-9]* ms' "$log" | head -1); $detail"
    step config 120 -- bash "$root/c-tests/hooks/config.sh" "$bin"
    row c-bad-config "$verdict" "$detail"
    if [ "$ngpu" -ge 2 ]; then
        step devices 180 CUDA_DEVICE_MEMORY_LIMIT_0=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g -- "$bin/t_devices"
        row c-visible-devices "$verdict" "$detail"
    else
        rows+=("$(printf '%-22s %-5s %s' c-visible-devices SKIP "needs 2 GPUs ($ngpu here)")")
    fi
fi
# ns_script STEP ROW TAG SCRIPT: runs c-tests/gpu/SCRIPT (pid namespaces, nvidia-smi; not under
# step(): nvidia-smi outside must see the real process list) and makes its row from the PASS /
# FAIL / SKIP lines tagged [TAG]. Builds the hook tests' demo program it needs.
ns_script() {
    local name=$1 rowname=$2 tag=$3 script=$4
    wanted "$name" || return 0
    [ -x "$bin/demo" ] || timeout 60 make -s -C "$root/c-tests/hooks" demo BUILD="$bin" \
        CUDA_LIBS="-L$work/lib -Wl,--no-as-needed -l:libcuda.so.1 -l:libnvidia-ml.so.1" >>"$work/build.log" 2>&1 ||
        { row "$rowname" FAIL "could not build demo"; return 0; }
    log=$work/$name.log
    echo "=== $name"
    timeout -k 5 150 bash "$here/$script" "$bin" "$vgpu" >"$log" 2>&1
    cat "$log"
    if grep -q '^SKIP' "$log"; then
        rows+=("$(printf '%-22s %-5s %s' "$rowname" SKIP "$(sed -n "s/^SKIP \[$tag\] //p" "$log")")")
    elif grep -q '^FAIL' "$log" || ! grep -q '^PASS' "$log"; then
        row "$rowname" FAIL "$(grep '^FAIL' "$log" | head -1)"
    else
        row "$rowname" PASS "$(sed -n "s/^PASS \[$tag\] //p" "$log" | tr '\n' ';')$(grep -o '[0-9]* of [0-9]* ready in [0-9]* ms' "$log" | head -1)"
    fi
}
# Host pids found by 16 processes in one pid namespace.
ns_script hostpid-ns hostpid-16-in-pidns hostpid hostpid.sh
# nvidia-smi inside a pid namespace lists the container's processes, nothing of another's.
ns_script procs-ns nvidia-smi-procs procs procs.sh
if command -v python3 >/dev/null; then
    step ctypes 60 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT=4g -- python3 "$root/c-tests/hooks/t_ctypes.py"
    row python-ctypes "$verdict" "$detail"
fi
if [ -x "$bin/cuda_runtime" ]; then
    step cudart 120 CUDA_DEVICE_MEMORY_LIMIT=4g -- "$bin/cuda_runtime" $((4 << 30))
    row cuda-runtime "$verdict" "$(info 'got=[0-9]*') $(info 'ctx=[0-9]*'); $detail"
fi

# ---- PyTorch -----------------------------------------------------------------------------
torch_ok=0
if [ "${HK_SKIP_TORCH:-0}" != 1 ] && { [ -z "${GPU_ONLY:-}" ] || [[ $GPU_ONLY == *torch* ]]; } && timeout 120 python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
    torch_ok=1
fi
limit4=$((4 << 30))
py="$here/torch_alloc.py"
if [ "$torch_ok" = 1 ]; then
    step torch-oom 180 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT_BYTES=$limit4 -- python3 "$py" oom 256
    row torch-oom-4g "$verdict" "$(info 'got_mib=[0-9]*') $(info 'nvml_process_mib=[0-9A-Za-z]*'); $detail"
    step torch-expandable 180 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT_BYTES=$limit4 \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- python3 "$py" oom 256
    row torch-expandable "$verdict" "$(info 'got_mib=[0-9]*') $(info 'nvml_process_mib=[0-9A-Za-z]*') (cuMemCreate); $detail"
    step torch-async 180 CUDA_DEVICE_MEMORY_LIMIT=4g HK_LIMIT_BYTES=$limit4 \
        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- python3 "$py" oom 256
    row torch-mallocasync "$verdict" "$(info 'got_mib=[0-9]*') $(info 'nvml_process_mib=[0-9A-Za-z]*') (pools); $detail"

    if wanted torch-two; then
        # Two processes share one limit: A holds 2 GiB, B allocates until refused.
        shared=$work/shared.region
        rm -f "$shared" "$work/a.ready"
        env CUDA_DEVICE_MEMORY_SHARED_CACHE="$shared" LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_LIMIT=4g \
            timeout -k 5 240 python3 "$py" hold 2048 "$work/a.ready" >"$work/a.log" 2>&1 &
        apid=$!
        for _ in $(seq 1 120); do [ -f "$work/a.ready" ] && break; sleep 0.5; done
        if [ -f "$work/a.ready" ]; then
            log=$work/b.log
            env CUDA_DEVICE_MEMORY_SHARED_CACHE="$shared" LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_LIMIT=4g \
                HK_LIMIT_BYTES=$limit4 timeout -k 5 180 python3 "$py" oom 128 >"$log" 2>&1
            rc=$?
            cat "$log"
            got=$(sed -n 's/.*got_mib=\([0-9]*\).*/\1/p' "$log" | head -1)
            # B can have at most 4 GiB - 2 GiB - two contexts.
            if [ "$rc" -eq 0 ] && [ -n "$got" ] && [ "$got" -lt 2048 ] && [ "$got" -gt 256 ]; then
                row torch-two-processes PASS "A holds 2048 MiB, B got $got MiB of the shared 4096 MiB"
            else
                row torch-two-processes FAIL "A holds 2048 MiB, B got ${got:-?} MiB (rc $rc)"
            fi
            # nvidia-smi inside the container (preloaded, same region) shows the limit.
            env CUDA_DEVICE_MEMORY_SHARED_CACHE="$shared" LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_LIMIT=4g \
                timeout 30 nvidia-smi >"$work/smi.txt" 2>&1
            cat "$work/smi.txt"
            smi=$(env CUDA_DEVICE_MEMORY_SHARED_CACHE="$shared" LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_LIMIT=4g \
                timeout 30 nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits 2>&1 | head -1)
            host=$(timeout 30 nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader,nounits 2>&1 | head -1)
            total=$(echo "$smi" | cut -d, -f1 | tr -d ' ')
            if [ "$total" = 4096 ]; then
                row nvidia-smi-inside PASS "total,used = $smi MiB inside; $host MiB outside"
            else
                row nvidia-smi-inside FAIL "total,used = '$smi' inside (want 4096); $host outside"
            fi
            # A (the python process itself, not its timeout wrapper) is SIGKILLed: its 2 GiB become
            # available to the next process.
            kill -KILL "$(cat "$work/a.ready")" 2>/dev/null
            wait "$apid" 2>/dev/null
            sleep 1
            log=$work/c.log
            env CUDA_DEVICE_MEMORY_SHARED_CACHE="$shared" LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_LIMIT=4g \
                HK_LIMIT_BYTES=$limit4 timeout -k 5 180 python3 "$py" oom 128 >"$log" 2>&1
            rc=$?
            cat "$log"
            got2=$(sed -n 's/.*got_mib=\([0-9]*\).*/\1/p' "$log" | head -1)
            if [ "$rc" -eq 0 ] && [ -n "$got2" ] && [ -n "$got" ] && [ "$got2" -gt $((got + 1536)) ]; then
                row torch-sigkill PASS "after SIGKILL of A the next process got $got2 MiB (B had $got)"
            else
                row torch-sigkill FAIL "after SIGKILL of A the next process got ${got2:-?} MiB (B had ${got:-?}, rc $rc)"
            fi
        else
            kill -KILL "$apid" 2>/dev/null
            wait "$apid" 2>/dev/null
            cat "$work/a.log"
            row torch-two-processes FAIL "process A never got its 2 GiB"
        fi
    fi
else
    rows+=("$(printf '%-22s %-5s %s' pytorch SKIP "no PyTorch with CUDA (or HK_SKIP_TORCH=1, or left out by GPU_ONLY)")")
fi

echo
echo "=== libvgpu.so on $gpu, driver $driver"
{
    printf '%-22s %-5s %s\n' step result details
    printf '%s\n' "${rows[@]}"
    echo "$npass passed, $nfail failed"
} | tee "${HK_RESULTS:-/dev/null}"
[ "$nfail" -eq 0 ]
