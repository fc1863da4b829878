#!/usr/bin/env bash
# config.sh BIN_DIR: bad configuration is reported with one clear line naming the variable, and
# the documented outcome follows: the size spellings people write are limits; a malformed memory
# limit gives the process no GPU memory (never no limit) and leaves the region to a correctly
# configured process; a stray per-device name is ignored with one line. Each check prints
# PASS/FAIL; exit status 1 on any failure.
#
# Checks tagged [runtime refusal] test what the runtime does with Config::mem_limit_malformed
# (refuse every allocation, do not initialise the region), not what the configuration says.
set -u
bin=$1/t_config
pass=0 fail=0
check() { # check NAME CONDITION-STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "PASS [config] $1"; else fail=$((fail + 1)); echo "FAIL [config] $1"; fi
}
# run ENV... : runs t_config; sets $out, $err and $rc. The region file is a fresh one, removed
# afterwards, unless $keep_cache names one to use and keep.
run() {
    local cache=${keep_cache:-$(mktemp -u /tmp/hk-config-region.XXXXXX)}
    local errf; errf=$(mktemp /tmp/hk-config-err.XXXXXX)
    out=$(env CUDA_DEVICE_MEMORY_SHARED_CACHE="$cache" "$@" "$bin" 2>"$errf"); rc=$?
    err=$(cat "$errf"); rm -f "$errf"
    [ -n "${keep_cache:-}" ] || rm -f "$cache"
}
field() { sed -n "s/.*\\b$1=\(-\?[0-9]*\).*/\1/p" <<<"$out"; }
count() { grep -c -- "$1" <<<"$err"; }
OOM=2 GIB=1073741824

# The spellings people write: all 1024-based, all silent.
for spelling in 1gb 1GB 1GiB 1Gi 1G 1g 1024MiB 1024m 1048576k 1073741824 0x40000000; do
    run CUDA_DEVICE_MEMORY_LIMIT=$spelling
    check "CUDA_DEVICE_MEMORY_LIMIT=$spelling: total $(field total) == 1 GiB, nothing logged ('$err')" \
        $([ "$(field total)" = "$GIB" ] && [ -z "$err" ]; echo $?)
done
run CUDA_DEVICE_MEMORY_LIMIT=1536MiB
check "CUDA_DEVICE_MEMORY_LIMIT=1536MiB: total $(field total) and cuDeviceTotalMem $(field devtotal) == 1536 MiB" \
    $([ "$(field total)" = "1610612736" ] && [ "$(field devtotal)" = "1610612736" ]; echo $?)

# Malformed: one line, no GPU memory, and a correctly configured process joining afterwards
# still has its limit (the malformed one did not create the region without a limit).
for bad in 1gbx -1 "" lots; do
    region=$(mktemp -u /tmp/hk-config-region.XXXXXX)
    keep_cache=$region run CUDA_DEVICE_MEMORY_LIMIT="$bad"
    line=$(grep -- "CUDA_DEVICE_MEMORY_LIMIT=" <<<"$err")
    echo "     [config] stderr: $line"
    check "malformed \"$bad\": exactly one line names the variable (got $(count CUDA_DEVICE_MEMORY_LIMIT=))" \
        $([ "$(count CUDA_DEVICE_MEMORY_LIMIT=)" -eq 1 ]; echo $?)
    check "malformed \"$bad\": the line quotes the value, says what to write and that the process gets no GPU memory" \
        $(grep -qF "CUDA_DEVICE_MEMORY_LIMIT=\"$bad\" is not a size" <<<"$line" &&
            grep -q 'write ' <<<"$line" && grep -q 'no GPU memory' <<<"$line" &&
            ! grep -q 'no limit' <<<"$line"; echo $?)
    check "malformed \"$bad\": the line carries HAMi's log prefix" $(grep -q '^\[HAMI-core' <<<"$line"; echo $?)
    check "malformed \"$bad\": the program still runs (rc $rc)" $([ "$rc" -eq 0 ]; echo $?)
    check "malformed \"$bad\": cuCtxCreate or cuMemAlloc returns CUDA_ERROR_OUT_OF_MEMORY (ctx $(field ctx), alloc $(field alloc)) [runtime refusal]" \
        $([ "$(field ctx)" = "$OOM" ] || [ "$(field alloc)" = "$OOM" ]; echo $?)
    keep_cache=$region run CUDA_DEVICE_MEMORY_LIMIT=1g HK_ALLOC=1536m
    check "malformed \"$bad\", then a 1g process: its total $(field total) == 1 GiB [runtime refusal]" \
        $([ "$(field total)" = "$GIB" ]; echo $?)
    check "malformed \"$bad\", then a 1g process: 1.5 GiB is refused (alloc $(field alloc)) [runtime refusal]" \
        $([ "$(field alloc)" = "$OOM" ]; echo $?)
    rm -f "$region"
done

# A malformed per-device limit: no fallback to the global one, no GPU memory.
run CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_0=1.5g
echo "     [config] stderr: $(grep 'CUDA_DEVICE_MEMORY_LIMIT_0' <<<"$err")"
check "CUDA_DEVICE_MEMORY_LIMIT_0=1.5g: one line names it, says no GPU memory (got $(count CUDA_DEVICE_MEMORY_LIMIT_0=))" \
    $([ "$(count CUDA_DEVICE_MEMORY_LIMIT_0=)" -eq 1 ] && grep 'CUDA_DEVICE_MEMORY_LIMIT_0=' <<<"$err" | grep -q 'no GPU memory'; echo $?)
check "CUDA_DEVICE_MEMORY_LIMIT_0=1.5g: cuCtxCreate or cuMemAlloc returns CUDA_ERROR_OUT_OF_MEMORY (ctx $(field ctx), alloc $(field alloc)) [runtime refusal]" \
    $([ "$(field ctx)" = "$OOM" ] || [ "$(field alloc)" = "$OOM" ]; echo $?)

# 0 keeps meaning no limit, as upstream, with a warning.
run CUDA_DEVICE_MEMORY_LIMIT=0
check "CUDA_DEVICE_MEMORY_LIMIT=0: one line says no memory limit (got $(count CUDA_DEVICE_MEMORY_LIMIT=))" \
    $([ "$(count CUDA_DEVICE_MEMORY_LIMIT=)" -eq 1 ] && grep -q 'means no memory limit' <<<"$err"; echo $?)
check "CUDA_DEVICE_MEMORY_LIMIT=0: no limit: total $(field total) == physical $(field physical), alloc $(field alloc)" \
    $([ -n "$(field total)" ] && [ "$(field total)" = "$(field physical)" ] && [ "$(field alloc)" = 0 ]; echo $?)

# Per-device names that are no device index, and an index beyond the devices there are.
for name in CUDA_DEVICE_MEMORY_LIMIT_99 CUDA_DEVICE_MEMORY_LIMIT_x CUDA_DEVICE_SM_LIMIT_16; do
    run CUDA_DEVICE_MEMORY_LIMIT=1g "$name=50"
    echo "     [config] stderr: $err"
    check "$name: one line names it (got $(count "$name="))" $([ "$(count "$name=")" -eq 1 ]; echo $?)
    check "$name: ignored, the global limit holds: total $(field total) == 1 GiB" $([ "$(field total)" = "$GIB" ]; echo $?)
done
run CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_3=2g
echo "     [config] stderr: $err"
check "CUDA_DEVICE_MEMORY_LIMIT_3 on a 1-GPU machine: one line names it, once (got $(count CUDA_DEVICE_MEMORY_LIMIT_3))" \
    $([ "$(count CUDA_DEVICE_MEMORY_LIMIT_3)" -eq 1 ] && grep -q 'beyond the 1 CUDA device' <<<"$err"; echo $?)
run FAKE_CUDA_DEVICES=2 CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_1=2g
check "CUDA_DEVICE_MEMORY_LIMIT_1 on a 2-GPU machine is silent ('$err')" $([ -z "$err" ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_SM_LIMIT=150
check "CUDA_DEVICE_SM_LIMIT=150: one line names it (got $(count CUDA_DEVICE_SM_LIMIT))" $([ "$(count CUDA_DEVICE_SM_LIMIT)" -eq 1 ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g GPU_CORE_UTILIZATION_POLICY=sometimes
check "GPU_CORE_UTILIZATION_POLICY=sometimes: one line names it (got $(count GPU_CORE_UTILIZATION_POLICY))" \
    $([ "$(count GPU_CORE_UTILIZATION_POLICY)" -eq 1 ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g LIBCUDA_LOG_LEVEL=verbose
check "LIBCUDA_LOG_LEVEL=verbose: one line names it (got $(count LIBCUDA_LOG_LEVEL))" $([ "$(count LIBCUDA_LOG_LEVEL)" -eq 1 ]; echo $?)

for v in lots 99999999999999999999 0; do
    run CUDA_DEVICE_MEMORY_LIMIT=1g HAMI_CONTEXT_SIZE=$v
    echo "     [config] stderr: $err"
    check "HAMI_CONTEXT_SIZE=$v: one line names it, says the default is used, offers no 'no limit' (got $(count HAMI_CONTEXT_SIZE))" \
        $([ "$(count HAMI_CONTEXT_SIZE)" -eq 1 ] && grep -q 'default context estimate' <<<"$err" &&
            ! grep -q 'no limit' <<<"$err"; echo $?)
done

echo "config: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
