#!/usr/bin/env python3
"""t_ctypes: a Python program that loads the driver with ctypes (dlopen + dlsym, like PyTorch's
and CuPy's loaders) under LD_PRELOAD=libvgpu.so sees the limit and cannot allocate past it.
Environment: HK_LIMIT (bytes or with a g/m suffix, default 1g)."""
import ctypes
import os
import sys

from hk import Checks

MIB = 1 << 20
checks = Checks("ctypes")
check = checks.check


def size(s):
    s = s.strip()
    mult = {"g": 1 << 30, "m": 1 << 20, "k": 1 << 10}.get(s[-1:].lower(), 1)
    return int(s[:-1] if mult != 1 else s, 0) * mult


limit = size(os.environ.get("HK_LIMIT", "1g"))
cuda = ctypes.CDLL("libcuda.so.1")
nvml = ctypes.CDLL("libnvidia-ml.so.1")
preloaded = ctypes.CDLL(None)  # the global scope: libvgpu.so's hooks come first


def addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


check(addr(cuda, "cuMemAlloc_v2") == addr(preloaded, "cuMemAlloc_v2"),
      "ctypes' cuMemAlloc_v2 from libcuda.so.1 is the hook")

u64 = ctypes.c_uint64
sz = ctypes.c_size_t
CUDA_ERROR_OUT_OF_MEMORY = 2

assert cuda.cuInit(0) == 0
dev = ctypes.c_int()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p()
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
free, total = sz(), sz()
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
check(total.value == limit, "cuMemGetInfo_v2 total %d == limit %d" % (total.value, limit))
tm = sz()
assert cuda.cuDeviceTotalMem_v2(ctypes.byref(tm), dev) == 0
check(tm.value == limit, "cuDeviceTotalMem_v2 %d == limit" % tm.value)
ctx_cost = total.value - free.value
check(ctx_cost > 0, "the context's cost is counted (%d MiB)" % (ctx_cost // MIB))

ptrs = []
rc = 0
while len(ptrs) < 4096:
    p = u64()
    rc = cuda.cuMemAlloc_v2(ctypes.byref(p), sz(64 * MIB))
    if rc != 0:
        break
    ptrs.append(p)
got = len(ptrs) * 64 * MIB
print("     [ctypes] %d MiB admitted in 64 MiB chunks, context %d MiB" % (got // MIB, ctx_cost // MIB))
check(rc == CUDA_ERROR_OUT_OF_MEMORY, "refused with CUDA_ERROR_OUT_OF_MEMORY (got %d)" % rc)
check(got + ctx_cost <= limit < got + ctx_cost + 64 * MIB,
      "the limit holds and is usable: %d + %d <= %d" % (got, ctx_cost, limit))


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


assert nvml.nvmlInit_v2() == 0
h = ctypes.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
m = NvmlMemory()
assert nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
check(m.total == limit and m.used == got + ctx_cost,
      "nvmlDeviceGetMemoryInfo: total %d == limit, used %d == admitted + context" % (m.total, m.used))

fake_used = getattr(cuda, "fakeGpuRealUsed", None)
if fake_used is not None:
    fake_used.restype = ctypes.c_ulonglong
    real = fake_used(0)
    check(real <= limit, "the driver's real usage %d MiB <= limit" % (real // MIB))

for p in ptrs:
    assert cuda.cuMemFree_v2(p) == 0
assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
check(total.value - free.value == ctx_cost, "after the frees only the context is counted")
assert cuda.cuCtxDestroy_v2(ctx) == 0
checks.finish()
