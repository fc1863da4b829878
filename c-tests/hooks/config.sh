#!/usr/bin/env bash
# config.sh BIN_DIR: bad configuration is reported with one clear line naming the variable, and
# the documented fallback applies (a malformed limit is not applied; a malformed per-device limit
# falls back to the global one). Each check prints PASS/FAIL; exit status 1 on any failure.
set -u
bin=$1/t_config
pass=0 fail=0
check() { # check NAME CONDITION-STATUS
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "PASS [config] $1"; else fail=$((fail + 1)); echo "FAIL [config] $1"; fi
}
run() { # run ENV... ; sets $out and $err
    local cache; cache=$(mktemp -u /tmp/hk-config-region.XXXXXX)
    local errf; errf=$(mktemp /tmp/hk-config-err.XXXXXX)
    out=$(env CUDA_DEVICE_MEMORY_SHARED_CACHE="$cache" "$@" "$bin" 2>"$errf"); rc=$?
    err=$(cat "$errf"); rm -f "$errf" "$cache"
}
field() { sed -n "s/.*\\b$1=\([0-9]*\).*/\1/p" <<<"$out"; }

run CUDA_DEVICE_MEMORY_LIMIT=1gb
lines=$(grep -c 'CUDA_DEVICE_MEMORY_LIMIT' <<<"$err")
check "CUDA_DEVICE_MEMORY_LIMIT=1gb: exactly one line names the variable (got $lines)" $([ "$lines" -eq 1 ]; echo $?)
line=$(grep 'CUDA_DEVICE_MEMORY_LIMIT' <<<"$err")
echo "     [config] stderr: $line"
check "the line quotes the value and says it is not applied" $(grep -q '1gb' <<<"$line" && grep -qi 'not applied' <<<"$line"; echo $?)
check "the line carries HAMi's log prefix" $(grep -q '^\[HAMI-core' <<<"$line"; echo $?)
check "the program still runs (rc $rc)" $([ "$rc" -eq 0 ]; echo $?)
check "no limit is applied: total $(field total) == physical $(field physical)" $([ -n "$(field total)" ] && [ "$(field total)" = "$(field physical)" ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_LIMIT_0=1.5g
lines=$(grep -c 'CUDA_DEVICE_MEMORY_LIMIT_0' <<<"$err")
check "CUDA_DEVICE_MEMORY_LIMIT_0=1.5g: one line names it (got $lines)" $([ "$lines" -eq 1 ]; echo $?)
echo "     [config] stderr: $(grep 'CUDA_DEVICE_MEMORY_LIMIT_0' <<<"$err")"
check "the global limit applies instead: total $(field total) == 1 GiB" $([ "$(field total)" = "1073741824" ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1536m
check "a good limit is silent (stderr: '${err}')" $([ -z "$err" ]; echo $?)
check "CUDA_DEVICE_MEMORY_LIMIT=1536m: total $(field total) and cuDeviceTotalMem $(field devtotal) == 1536 MiB" $([ "$(field total)" = "1610612736" ] && [ "$(field devtotal)" = "1610612736" ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_SM_LIMIT=150
lines=$(grep -c 'CUDA_DEVICE_SM_LIMIT' <<<"$err")
check "CUDA_DEVICE_SM_LIMIT=150: one line names it (got $lines)" $([ "$lines" -eq 1 ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g GPU_CORE_UTILIZATION_POLICY=sometimes
lines=$(grep -c 'GPU_CORE_UTILIZATION_POLICY' <<<"$err")
check "GPU_CORE_UTILIZATION_POLICY=sometimes: one line names it (got $lines)" $([ "$lines" -eq 1 ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g LIBCUDA_LOG_LEVEL=verbose
lines=$(grep -c 'LIBCUDA_LOG_LEVEL' <<<"$err")
check "LIBCUDA_LOG_LEVEL=verbose: one line names it (got $lines)" $([ "$lines" -eq 1 ]; echo $?)

run CUDA_DEVICE_MEMORY_LIMIT=1g HAMI_CONTEXT_SIZE=lots
lines=$(grep -c 'HAMI_CONTEXT_SIZE' <<<"$err")
check "HAMI_CONTEXT_SIZE=lots: one line names it (got $lines)" $([ "$lines" -eq 1 ]; echo $?)

echo "config: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
