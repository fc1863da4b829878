#!/usr/bin/env bash
# c-tests/gpu/procs.sh BIN LIBVGPU: nvidia-smi inside a container lists the container's processes.
#
# Two processes of one region run inside a new pid namespace (unshare --pid --fork --mount-proc,
# as a container's do), holding 100 and 200 MiB beside their contexts (c-tests/hooks/demo hold);
# a third, of another region ("another container"), runs outside it holding 300 MiB. Inside the
# namespace, nvidia-smi under LD_PRELOAD=LIBVGPU must list exactly the two, under the pids the
# namespace knows, each with about the memory nvidia-smi outside reports for its host pid (the
# region counts what NVML measured for the context plus the allocation), and nothing of the
# third. Prints PASS/FAIL lines and both nvidia-smi views. Needs root for unshare; without it
# prints SKIP.
set -u
bin=$1
vgpu=$2
work=$(mktemp -d /tmp/hami-procs.XXXXXX)
trap 'rm -f "$work"/ready.*; sleep 0.5; rm -rf "$work"' EXIT
if ! unshare --pid --fork --mount-proc true 2>/dev/null; then
    echo "SKIP [procs] unshare --pid is not allowed here"
    exit 0
fi
hold() { # hold REGION MIB NAME
    env LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$1" CUDA_DEVICE_MEMORY_LIMIT=8g \
        timeout 120 "$bin/demo" hold "$2" "$work/ready.$3" >"$work/out.$3" 2>&1
}
wait_ready() {
    for _ in $(seq 1 300); do
        [ "$(ls "$work"/ready.* 2>/dev/null | wc -l)" -ge "$1" ] && return 0
        sleep 0.1
    done
    return 1
}
export -f hold
export vgpu bin work
hold "$work/other.region" 300 other &
other=$!
wait_ready 1
unshare --pid --fork --mount-proc bash -c '
    hold "$work/region" 100 a & echo $! >"$work/pid.a"
    hold "$work/region" 200 b & echo $! >"$work/pid.b"
    for _ in $(seq 1 300); do [ -f "$work/ready.a" ] && [ -f "$work/ready.b" ] && break; sleep 0.1; done
    sleep 1
    smi() { env LD_PRELOAD="$vgpu" CUDA_DEVICE_MEMORY_SHARED_CACHE="$work/region" \
        CUDA_DEVICE_MEMORY_LIMIT=8g timeout 30 nvidia-smi "$@" 2>>"$work/smi.err"; }
    smi >"$work/smi.inside"
    smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$work/apps.inside"
    touch "$work/queried"
    wait' &
ns=$!
for _ in $(seq 1 400); do [ -f "$work/queried" ] && break; sleep 0.1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits >"$work/apps.outside" 2>&1
# The holders' pids: `timeout` runs demo as its child, so the namespace pid of demo is the one
# after the wrapper's; read them from demo's own line.
pa=$(sed -n 's/.*\[pid \([0-9]*\)\] holds.*/\1/p' "$work/out.a")
pb=$(sed -n 's/.*\[pid \([0-9]*\)\] holds.*/\1/p' "$work/out.b")
px=$(sed -n 's/.*\[pid \([0-9]*\)\] holds.*/\1/p' "$work/out.other")
rm -f "$work"/ready.*
wait "$ns" "$other" 2>/dev/null
echo "--- nvidia-smi inside the pid namespace, under libvgpu:"
cat "$work/smi.inside"
[ -s "$work/smi.err" ] && echo "--- its stderr: $(tr '\n' ';' <"$work/smi.err")"
echo "--- nvidia-smi --query-compute-apps inside: $(tr '\n' ';' <"$work/apps.inside")"
echo "--- nvidia-smi --query-compute-apps outside: $(tr '\n' ';' <"$work/apps.outside")"
echo "     [procs] namespace pids a=$pa b=$pb; the other container's process: $px (host pid)"
inside_pids=$(cut -d, -f1 "$work/apps.inside" | tr -d ' ' | sort -n | tr '\n' ' ')
want=$(printf '%s\n' "$pa" "$pb" | sort -n | tr '\n' ' ')
if [ -n "$pa" ] && [ -n "$pb" ] && [ "$inside_pids" = "$want" ]; then
    echo "PASS [procs] inside, nvidia-smi lists exactly the container's processes under its pids: $inside_pids"
else
    echo "FAIL [procs] inside, nvidia-smi lists '$inside_pids' (want '$want')"
fi
if grep -q "^$px," "$work/apps.outside" && ! grep -q "^$px," "$work/apps.inside"; then
    echo "PASS [procs] the other container's process ($px) is listed outside, not inside"
else
    echo "FAIL [procs] the other container's process ($px): outside '$(grep "^$px," "$work/apps.outside")', inside '$(grep "^$px," "$work/apps.inside")'"
fi
# Inside, each holder's memory is the region's count; outside, the driver's for its host pid:
# the two sets agree within 8 MiB each (sorted, as the pids differ).
in_mem=$(cut -d, -f2 "$work/apps.inside" | tr -d ' ' | sort -n | tr '\n' ' ')
out_mem=$(grep -v "^$px," "$work/apps.outside" | cut -d, -f2 | tr -d ' ' | sort -n | tr '\n' ' ')
if [ -n "$in_mem" ] && awk -v a="$in_mem" -v b="$out_mem" 'BEGIN { n = split(a, x, " "); m = split(b, y, " ");
        if (n != m) exit 1; for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < -8 || d > 8) exit 1 } }'; then
    echo "PASS [procs] memory inside (the region's count) $in_mem MiB, outside (the driver's) $out_mem MiB"
else
    echo "FAIL [procs] memory inside $in_mem MiB, outside $out_mem MiB"
fi
