#!/usr/bin/env bash
# c-tests/gpu/sm_dry.sh: TEST ONLY, no GPU. Runs c-tests/gpu/sm_limit.sh and the real
# c-tests/gpu/sm_work.py against a stand-in `torch` (kernels are sleeps on the CPU), a stand-in
# nvidia-smi and an empty LD_PRELOAD library, to check the handshake, the rates, the bins, the
# settle column, the table, the clock lines (SM_CLOCKS=1) and the exit status. Nothing it prints
# is a GPU number.
#
# The stand-in throttles a process with CUDA_DEVICE_SM_LIMIT=L (L < 100, policy force) to L% of
# its speed from 0.6 s after it starts working (so "settle" reads 1s), except CUDA graph replays,
# which it never slows (so graph rows fail, mix rows miss their band and the exit status is 1).
# Checks that, and that the matmul rows pass. SM_ONLY (default
# '^(matmul|graph)/1p/|^matmul/2p/|^small/4p/none|^mix/1p/25'), SM_WARMUP (1), SM_MEASURE (2) and
# SM_PIPELINE go to sm_limit.sh; with SM_ONLY set it only shows the output. Then one more run
# with SM_REF_AFTER=1 and SM_CPUS=0 (the reference before and after). About a minute and a half.
# shellcheck disable=SC2016 # the checks below are single-quoted on purpose: check evaluates them
set -u
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/hami-smdry.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/py/torch" "$tmp/bin"

cat >"$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
*clocks.sm*) while :; do echo 1410; sleep 0.25; done ;;
*) echo "Stand-in GPU (sm_dry.sh), 0.0" ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi"
if command -v gcc >/dev/null; then
    echo 'int sm_dry_nothing;' | gcc -shared -fPIC -x c -o "$tmp/libvgpu.so" -
else
    : >"$tmp/libvgpu.so"  # ld.so warns and ignores it
fi

cat >"$tmp/py/torch/__init__.py" <<'EOF'
"""Stand-in torch for c-tests/gpu/sm_dry.sh only: kernels queue CPU time, synchronize sleeps it."""
import contextlib
import os
import time

bfloat16, float32 = "bf16", "f32"
_limit = int(os.environ.get("CUDA_DEVICE_SM_LIMIT", "100")) if os.environ.get("LD_PRELOAD") else 100
_slow = 100.0 / _limit if 0 < _limit < 100 and os.environ.get("GPU_CORE_UTILIZATION_POLICY") == "force" else 1.0
_st = {"pending": 0.0, "busy_since": None, "last": 0.0, "capture": None}


def _kernel(seconds):
    if _st["capture"] is not None:
        _st["capture"].append(seconds)
        return
    now = time.time()
    if _st["busy_since"] is None or now - _st["last"] > 0.3:  # idle: the "controller" starts over
        _st["busy_since"] = now
    _st["pending"] += seconds * (_slow if now - _st["busy_since"] > 0.6 else 1.0)


class Tensor:
    def __init__(self, *shape):
        self.shape = shape

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __matmul__(self, other):
        return matmul(self, other)

    def mul_(self, _):
        _kernel(3e-4 * self.numel() / (1 << 20))
        return self

    add_ = mul_


def randn(*shape, device=None, dtype=None):
    return Tensor(*shape)


ones = empty = randn


def matmul(a, b, out=None):
    _kernel(4e-3 * (a.shape[0] / 8192.0) ** 3)
    return out if out is not None else Tensor(a.shape[0], b.shape[1])


class _Graph:
    def __init__(self):
        self.costs = []

    def replay(self):
        _st["pending"] += sum(self.costs)  # the stand-in never slows a graph


class _Stream:
    def wait_stream(self, other):
        pass


class cuda:
    CUDAGraph = _Graph
    Stream = _Stream

    @staticmethod
    def synchronize():
        if _st["pending"] > 0:
            time.sleep(_st["pending"])
        _st["pending"] = 0.0
        _st["last"] = time.time()

    @staticmethod
    def current_stream():
        return _Stream()

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        yield

    @staticmethod
    @contextlib.contextmanager
    def graph(g):
        _st["capture"] = g.costs
        try:
            yield
        finally:
            _st["capture"] = None
EOF

out=$tmp/out.txt
PATH="$tmp/bin:$PATH" PYTHONPATH="$tmp/py" HK_RESULTS="$tmp/results.txt" SM_TRACE="$tmp/trace" \
    SM_ONLY=${SM_ONLY:-'^(matmul|graph)/1p/|^matmul/2p/|^small/4p/none|^mix/1p/25'} \
    SM_WARMUP=${SM_WARMUP:-1} SM_MEASURE=${SM_MEASURE:-2} SM_CLOCKS=1 \
    bash "$here/sm_limit.sh" "$tmp/libvgpu.so" >"$out" 2>&1
rc=$?
cat "$out"
ntrace=$(find "$tmp/trace" -name '*.log' | wc -l)
echo "--- sm_limit.sh exit status $rc; trace files: $ntrace; results file lines: $(wc -l <"$tmp/results.txt")"
bad=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; bad=$((bad + 1)); fi; }
row() { grep -E "^$1 +$2 +$3 " "$out"; }
if [ -z "${SM_ONLY:-}" ]; then
    check "exit status 1 (graph rows fail)" '[ "$rc" = 1 ]'
    check "matmul 1p/2p limited rows pass" '[ "$(grep -cE "^matmul +[12] +(25|50|75) .* PASS " "$out")" = 6 ]'
    check "graph limited rows fail" '[ "$(grep -cE "^graph +1 +(25|50|75) .* FAIL " "$out")" = 3 ]'
    check "plain row and the library-cost line" 'row matmul 1 plain >/dev/null && grep -q "of the plain driver" "$out"'
    check "small/4p reference only" 'row small 4 none >/dev/null && ! row small 4 25 >/dev/null'
    check "settle 1s on a limited matmul row" 'row matmul 1 25 | grep -q " 1s "'
    check "a bins line per row" \
        '[ "$(sed -n "/^1-s bins/,/^SM clock/p" "$out" | grep -cE "^[a-z]+/[124]p/[a-z0-9]+ +[0-9]")" = 16 ]'
    check "trace kept each process log" '[ "$ntrace" = 23 ]'
    check "a clock line per row, 1410 MHz in each of its 3 bins (SM_CLOCKS)" \
        '[ "$(sed -n "/^SM clock (MHz)/,\$p" "$out" | grep -cE "^[a-z]+/[124]p/[a-z0-9]+ +1410 1410 1410$")" = 16 ]'
    check "results file has the table" 'grep -q "rows outside the band" "$tmp/results.txt"'
    # The reference taken before and after the limited rows (SM_REF_AFTER), under taskset.
    out2=$tmp/out2.txt
    PATH="$tmp/bin:$PATH" PYTHONPATH="$tmp/py" SM_ONLY='^matmul/1p/50' SM_REF_AFTER=1 SM_CPUS=0 \
        SM_WARMUP=1 SM_MEASURE=2 bash "$here/sm_limit.sh" "$tmp/libvgpu.so" >"$out2" 2>&1
    cat "$out2"
    ref2() { awk -v w="$1" '$1 == "matmul" && $3 == w { print $7 }' "$out2"; }
    check "again row, drift line, reference the mean of both" \
        'row2=$(awk "\$1 == \"matmul\" && \$3 == 50 { print \$8 }" "$out2");
         [ -n "$(ref2 again)" ] && grep -q "^matmul/1p: unlimited .* before the limited rows, .* after" "$out2" &&
         awk -v a="$(ref2 none)" -v b="$(ref2 again)" -v r="$row2" "BEGIN { exit !(r > 0 && (r - (a + b) / 2) ^ 2 < 0.01) }"'
    echo "$((11 - bad)) passed, $bad failed"
fi
[ "$bad" = 0 ]
