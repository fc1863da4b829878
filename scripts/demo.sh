#!/usr/bin/env bash
# scripts/demo.sh: libvgpu.so in one minute. Builds the library, then runs a small CUDA program
# under LD_PRELOAD with CUDA_DEVICE_MEMORY_LIMIT=1g (DEMO_LIMIT to change it) and shows what the
# application sees: cuMemGetInfo reports the limit as the total, allocations past the limit are
# refused with CUDA_ERROR_OUT_OF_MEMORY, and two processes share the one limit.
# Where nvidia-smi works it runs against the real driver, with a 2 GiB limit by default (a real
# context costs about 500 MiB, and two must fit); otherwise against the stand-in driver of
# c-tests/fake-driver (a 16 GiB "Fake H200" whose contexts cost 100 MiB here).
set -u
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d /tmp/hami-demo.XXXXXX)
trap 'rm -f "$work"/*.ready; rm -rf "$work"' EXIT

say() { printf '\n== %s\n' "$*"; }

say "building libvgpu.so (cargo build --release -p hami-vgpu)"
cargo build --release -p hami-vgpu 2>&1 | tail -2 || { echo "build failed"; exit 1; }
vgpu=$root/target/release/libvgpu.so
[ -f "$vgpu" ] || { echo "no $vgpu"; exit 1; }

if nvidia-smi -L >/dev/null 2>&1; then
    mode="the real driver ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
    libdir=$work/lib
    mkdir -p "$libdir"
    ln -sf "$(ldconfig -p | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')" "$libdir/libcuda.so.1"
    ln -sf "$(ldconfig -p | awk '/libnvidia-ml\.so\.1 .*x86-64/ {print $NF; exit}')" "$libdir/libnvidia-ml.so.1"
    extra_env=()
    limit=${DEMO_LIMIT:-2g}
else
    mode="the stand-in driver (no GPU here)"
    libdir=$work/fake
    say "building the stand-in driver (make -C c-tests/fake-driver)"
    make -s -C c-tests/fake-driver OUT="$libdir" || { echo "fake driver build failed"; exit 1; }
    extra_env=(FAKE_GPU_STATE="$work/fake-gpu.state" LD_LIBRARY_PATH="$libdir" FAKE_CTX_BYTES=100m)
    limit=${DEMO_LIMIT:-1g}
fi
make -s -C c-tests/hooks demo BUILD="$work/bin" \
    CUDA_LIBS="-L$libdir -Wl,--no-as-needed -l:libcuda.so.1 -l:libnvidia-ml.so.1 -Wl,-rpath,$libdir" \
    || { echo "demo build failed"; exit 1; }
demo=$work/bin/demo
region=$work/cudevshr.cache
run() { env "${extra_env[@]}" CUDA_DEVICE_MEMORY_SHARED_CACHE="$region" CUDA_DEVICE_MEMORY_LIMIT="$limit" \
    LD_PRELOAD="$vgpu" "$@"; }

say "without libvgpu.so: the whole device"
env "${extra_env[@]}" "$demo" fill 2>&1 | head -1

say "with LD_PRELOAD=libvgpu.so CUDA_DEVICE_MEMORY_LIMIT=$limit, on $mode"
run "$demo" alone 2>&1 | grep -v '^\[HAMI-core Warn'

say "two processes share the limit: A holds 512 MiB, then B allocates what is left"
rm -f "$region"
run "$demo" hold 512 "$work/a.ready" &
apid=$!
for _ in $(seq 1 200); do [ -f "$work/a.ready" ] && break; sleep 0.05; done
run "$demo" fill 2>&1 | grep -v '^\[HAMI-core Warn'
rm -f "$work/a.ready"
wait "$apid"
say "after A exits, B gets it all again"
run "$demo" fill 2>&1 | grep -v '^\[HAMI-core Warn'
echo
echo "Each process's context counts against the limit too; see ffi/src/hooks/mod.rs."
