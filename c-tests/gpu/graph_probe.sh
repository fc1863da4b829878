#!/usr/bin/env bash
# c-tests/gpu/graph_probe.sh: what the real driver does with CUDA graphs, WITHOUT libvgpu (see
# graph_probe.c). For the device machine (gcc and the NVIDIA driver; no Rust): run from anywhere,
# prints under 80 lines to stdout. Builds against the real libcuda.so.1 as run.sh does.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=$(mktemp -d /tmp/hami-probe.XXXXXX)
trap 'rm -rf "$work"' EXIT
libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF; exit}')
libnvml=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$libcuda" ] || libcuda=$(ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/local/nvidia/lib64/libcuda.so.1 2>/dev/null | head -1)
[ -n "$libnvml" ] || libnvml=$(ls /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 /usr/local/nvidia/lib64/libnvidia-ml.so.1 2>/dev/null | head -1)
echo "driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1); libcuda.so.1: $libcuda -> $(readlink -f "$libcuda")"
mkdir -p "$work/lib"
ln -sf "$libcuda" "$work/lib/libcuda.so.1"
ln -sf "$libnvml" "$work/lib/libnvidia-ml.so.1"
# The dynamic symbol table's entries for these names: several of one name (versions), IFUNC?
readelf --dyn-syms -W "$(readlink -f "$libcuda")" 2>/dev/null |
    awk '$8 ~ /^cuGraph(Instantiate(_v2|WithFlags)?|AddNode(_v2)?|NodeGetParams)(@.*)?$/ {print "  dynsym:", $2, $4, $5, $6, $7, $8}'
readelf -V -W "$(readlink -f "$libcuda")" 2>/dev/null | grep -c 'Name:' | sed 's/^/  symbol version entries: /'
gcc -std=gnu11 -O2 -Wall -Wextra -I "$root/ffi/include" -I "$root/c-tests/fake-driver" \
    -o "$work/probe" "$here/graph_probe.c" -L"$work/lib" -Wl,--no-as-needed -l:libcuda.so.1 \
    -l:libnvidia-ml.so.1 -ldl || exit 1
env -u LD_PRELOAD timeout 120 "$work/probe"
echo "graph_probe exit $?"
