#!/usr/bin/env bash
# c-tests/gpu/hostpid.sh BIN LIBVGPU: host pid discovery on a real driver, in a real pid namespace.
#
# Starts 16 processes together inside one new pid namespace (unshare --pid --fork --mount-proc,
# as a container's processes are), sharing one region; each creates a context and holds 16 MiB
# (c-tests/hooks/demo hold). While all hold, one of two outcomes passes:
# - the driver reports host pids: the host pids they found (their log line "host pid N found in
#   M ms (by HOW)") are 16 distinct pids, exactly those that nvidia-smi outside lists for them;
# - the driver translates pids (NVML inside lists namespace pids): each process says so in one
#   info line and records no host pid (hostpid stays 0 for HAMi's monitor), with no failure.
# Prints PASS/FAIL lines. Needs root for unshare; without it prints SKIP. BIN is the folder with
# the hook tests' demo program.
set -u
bin=$1
vgpu=$2
n=${HOSTPID_PROCS:-16}
work=$(mktemp -d /tmp/hami-hostpid.XXXXXX)
trap 'rm -rf "$work"' EXIT
if ! unshare --pid --fork --mount-proc true 2>/dev/null; then
    echo "SKIP [hostpid] unshare --pid is not allowed here"
    exit 0
fi
before=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | sort -n)
t0=$(date +%s%N)
unshare --pid --fork --mount-proc bash -c '
    for i in $(seq 1 '"$n"'); do
        env LD_PRELOAD='"$vgpu"' CUDA_DEVICE_MEMORY_SHARED_CACHE='"$work"'/region LIBCUDA_LOG_LEVEL=4 \
            CUDA_DEVICE_MEMORY_LIMIT=32g timeout 120 '"$bin"'/demo hold 16 '"$work"'/ready.$i \
            >'"$work"'/out.$i 2>&1 &
    done
    wait' &
ns=$!
for _ in $(seq 1 600); do
    [ "$(ls "$work"/ready.* 2>/dev/null | wc -l)" -ge "$n" ] && break
    sleep 0.1
done
t1=$(date +%s%N)
ready=$(ls "$work"/ready.* 2>/dev/null | wc -l)
after=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | sort -n)
listed=$(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')
found=$(cat "$work"/out.* | sed -n 's/.*host pid \([0-9]*\) found in \([0-9]*\) ms (by \([A-Za-z -]*\)).*/\1/p' | sort -n | tr '\n' ' ')
how=$(cat "$work"/out.* | sed -n 's/.*host pid [0-9]* found in [0-9]* ms (by \([A-Za-z -]*\)).*/\1/p' | sort | uniq -c | tr '\n' ';')
slowest=$(cat "$work"/out.* | sed -n 's/.*host pid [0-9]* found in \([0-9]*\) ms.*/\1/p' | sort -n | tail -1)
rm -f "$work"/ready.*
wait "$ns"
echo "     [hostpid] $ready of $n ready in $(((t1 - t0) / 1000000)) ms; found: $how slowest ${slowest:-?} ms"
echo "     [hostpid] nvidia-smi lists: $listed"
echo "     [hostpid] the processes found: $found"
nfound=$(echo "$found" | wc -w)
ndistinct=$(echo "$found" | tr ' ' '\n' | grep -c . | tr -d ' ')
[ "$(echo "$found" | tr ' ' '\n' | grep . | sort -u | wc -l)" = "$nfound" ] || ndistinct=dup
nsline=$(cat "$work"/out.* | grep -c "its pid in the container's namespace")
failures=$(cat "$work"/out.* | grep -c "SET_TASK_PID FAILED")
nlisted=$(echo "$listed" | wc -w)
if [ "$ready" -eq "$n" ] && [ "$nfound" -eq "$n" ] && [ "$ndistinct" = "$n" ] && [ "$found" = "$listed" ]; then
    echo "PASS [hostpid] $n processes in one pid namespace found $n distinct host pids, exactly those nvidia-smi lists"
elif [ "$ready" -eq "$n" ] && [ "$nsline" -eq "$n" ] && [ "$nfound" -eq 0 ] && [ "$failures" -eq 0 ] && [ "$nlisted" -eq "$n" ]; then
    echo "PASS [hostpid] the driver translates pids: all $n processes said so, recorded no host pid (left to the monitor), no failure; nvidia-smi outside lists $nlisted"
else
    echo "FAIL [hostpid] $n processes: $ready ready, $nfound host pids found ($ndistinct distinct), $nsline namespace-pid lines, $failures failures; nvidia-smi: $listed"
    grep -h "HAMI" "$work"/out.* | grep -v Debug | sort | uniq -c | head -5
fi
