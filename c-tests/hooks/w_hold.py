#!/usr/bin/env python3
"""w_hold BYTES [launch]: a process of a container for the shrreg-tool tests. Under LD_PRELOAD of
libvgpu.so it creates a context on device 0, allocates BYTES (one cuMemAlloc), and with `launch`
launches one kernel (so the region records a last kernel time), prints `ready`, then holds all of
it until its stdin closes."""
import ctypes
import sys

SPIN_PTX = b".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry spin()\n{\n ret;\n}\n"


def main():
    nbytes = int(sys.argv[1])
    cuda = ctypes.CDLL("libcuda.so.1")
    p = ctypes.c_void_p
    assert cuda.cuInit(0) == 0
    dev, ctx, ptr = ctypes.c_int(), p(), ctypes.c_uint64()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)) == 0
    if "launch" in sys.argv[2:]:
        mod, fn = p(), p()
        assert cuda.cuModuleLoadData(ctypes.byref(mod), SPIN_PTX) == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin") == 0
        u = ctypes.c_uint
        assert cuda.cuLaunchKernel(fn, u(1), u(1), u(1), u(32), u(1), u(1), u(0), p(), p(), p()) == 0
        assert cuda.cuCtxSynchronize() == 0
    print("ready", flush=True)
    sys.stdin.read()
    cuda.cuMemFree_v2(ptr)
    cuda.cuCtxDestroy_v2(ctx)


main()
